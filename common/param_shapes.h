// The Hugging Face parameter names and shapes of a Llama/Qwen2/Qwen3/Mistral/Qwen3-MoE/Mixtral/
// Gemma 2 causal LM, derived from its ModelSpec: what a checkpoint of that model must contain.
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/chunk_packing.h"
#include "common/types.h"

namespace memplan {

struct ParamShape {
  std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  int group = 0;  // 0 = embedding, 1..N = block N-1, N+1 = final norm + LM head

  int64_t numel() const;
};

// [Parameter order] The one order of a model's parameters, used by the planner's chunk layout,
// the agent's parameter groups (LlamaModel::ParamGroups), hence its chunks and its optimizer
// order: groups in execution order (embedding; each block; final norm, then "lm_head.weight"
// unless tie_word_embeddings, a tied head being the embedding's tensor, listed once, in group 0);
// inside a block Hugging Face's named_parameters() order: self_attn q, k, v, o (each weight
// followed by its bias), q_norm, k_norm; mlp gate, up, down; input_layernorm,
// post_attention_layernorm (Gemma 2: then pre_feedforward_layernorm, post_feedforward_layernorm).
// A sparse (mixture-of-experts) layer lists, in place of mlp gate, up,
// down, its router and then each expert in index order with its gate, up, down: the names of the
// checkpoints on disk (MoeRouterName, MoeExpertName), which transformers 5 fuses into 3-D tensors
// in memory only. A vision-language model lists its vision tower (VisionParamShapes) in group 0,
// after the embedding, as transformers runs it after the token embedding. Changing it changes
// every chunk layout and plan fingerprint.
std::vector<ParamShape> HfParamShapes(const ModelSpec& model);

// The vision tower's parameters (empty without one), Hugging Face's names and order:
// "visual.patch_embed.proj.weight" [hidden, channels, temporal_patch, patch, patch]; per block
// norm1, norm2, attn.qkv (weight, bias), attn.proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj
// (each weight then bias); merger ln_q, mlp.0, mlp.2. Qwen2-VL (common/vision_kind.h): each norm's
// bias after its weight, mlp.fc1 and mlp.fc2 for the MLP.
std::vector<ParamShape> VisionParamShapes(const ModelSpec& model);

// Checkpoint names of a sparse layer's router and of one expert's projections:
// "model.layers.<l>.mlp.gate.weight", "model.layers.<l>.mlp.experts.<e>.<gate|up|down>_proj.weight"
// (qwen3_moe); "model.layers.<l>.block_sparse_moe.gate.weight",
// "model.layers.<l>.block_sparse_moe.experts.<e>.<w1|w3|w2>.weight" (mixtral).
enum class MoeProjection { kGate, kUp, kDown };
std::string MoeRouterName(const ModelSpec& model, int64_t layer);
std::string MoeExpertName(const ModelSpec& model, int64_t layer, int64_t expert,
                          MoeProjection which);

// HfParamShapes as the chunk packing's input ([Chunk packing rule]), every parameter
// `dtype_bytes` wide: the list whose LayoutFingerprint the plans carry.
std::vector<LayoutParam> LayoutParamsFor(const ModelSpec& model, int64_t dtype_bytes);

}  // namespace memplan
