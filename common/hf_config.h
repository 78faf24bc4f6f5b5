// Hugging Face config.json -> ModelSpec for LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// MistralForCausalLM, the mixtures of experts Qwen3MoeForCausalLM and MixtralForCausalLM, the
// vision-language Qwen2_5_VLForConditionalGeneration and Qwen2VLForConditionalGeneration, and
// Gemma2ForCausalLM and Gemma3ForCausalLM (their keys: hf_json::ParseGemma and Gemma3RopeRoot in
// common/hf_config_json.h). The
// result passes ValidateModelSpec; every error is INVALID_ARGUMENT (NOT_FOUND for a missing file)
// and names the offending JSON key. Torch-free, protobuf-free.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"

namespace memplan {

// Parses the text of a config.json. ModelSpec::name is taken from "_name_or_path" when present,
// else from model_type. Absent or null optional keys take the family's Hugging Face defaults:
// num_key_value_heads = num_attention_heads, head_dim = hidden_size / num_attention_heads (128
// for qwen3), rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false. qkv_bias is set for
// qwen2, qk_norm for qwen3. Features the ModelSpec cannot express (hidden_act other than silu,
// mlp_bias, attention_bias on llama/qwen3/mistral) are rejected.
// RoPE: both layouts are read — top-level "rope_theta" + "rope_scaling" (published checkpoints,
// older releases) and "rope_parameters" (transformers 5.x) — the way transformers standardises
// them; the types default, linear, dynamic, yarn and llama3 are kept in ModelSpec::rope_scaling,
// any other type, an unknown key of the RoPE dictionary, partial_rotary_factor != 1 or per-layer
// RoPE dictionaries are refused with the key named. Sliding-window attention is recorded in
// ModelSpec::sliding_window and ::sliding_layers, as transformers decides which layers slide.
// Mixtures of experts: the expert count, top-k, expert width, norm_topk_prob,
// decoder_sparse_step, mlp_only_layers, output_router_logits and router_aux_loss_coef with
// transformers' defaults; Mixtral's router_jitter_noise > 0 is refused.
// Vision-language (Qwen2.5-VL, Qwen2-VL): the language model's keys at the top level
// (published checkpoints) or under "text_config" (transformers 5; errors then name
// "text_config.<key>"), RoPE "mrope"/"default" with rope_*.mrope_section, "vision_config" into
// ModelSpec::vision (errors name "vision_config.<key>"), the image/video/vision start/end token
// ids; a sliding window and any vision hidden_act but silu (quick_gelu for Qwen2-VL, whose
// embed_dim / hidden_size / mlp_ratio become the VisionSpec's widths) are refused.
absl::StatusOr<ModelSpec> ParseHfConfigJson(absl::string_view json);

// The RoPE of `spec` as a transformers 5.x "rope_parameters" JSON object, and back (into
// spec->rope_theta and spec->rope_scaling, with the same checks as ParseHfConfigJson; spec->family
// and max_position_embeddings must be set).
std::string RopeParametersJson(const ModelSpec& spec);
absl::Status ParseRopeParametersJson(absl::string_view json, ModelSpec* spec);

// A config.json for `spec` that transformers loads as the same model (LlamaForCausalLM, ...;
// transformers 5's nested layout for Qwen2.5-VL and Qwen2-VL) and ParseHfConfigJson reads back to the same
// ModelSpec (name aside).
std::string ToHfConfigJson(const ModelSpec& spec, DType dtype);

// Reads `path` (a config.json file, or a directory containing one) and parses it. ModelSpec::name
// is the directory name when the JSON carries no "_name_or_path".
absl::StatusOr<ModelSpec> LoadHfConfigFile(const std::string& path);

}  // namespace memplan
