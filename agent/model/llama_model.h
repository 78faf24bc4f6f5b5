// LlamaModel: a Llama-family decoder (Llama 3.x, Qwen2/2.5 qkv bias, Qwen3 q/k norm, Mistral, the
// mixtures of experts Qwen3-MoE and Mixtral through agent/model/moe.h, and Gemma 2's block in
// llama_model_gemma.cc) in LibTorch with Hugging Face parameter names, a plain-autograd reference
// loss, and a grouped loss that runs every parameter group through agent/blocks (block activation
// modes + ParamResidency).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/model/lora_options.h"
#include "agent/model/moe.h"
#include "agent/model/osft_options.h"
#include "agent/model/vision_tower.h"
#include "agent/core/param_residency.h"
#include "agent/quant/nf4.h"
#include "common/head_chunking.h"
#include "common/types.h"

namespace memplan {

class ActivationOffloader;
class MoeRouterLoss;

// One mode per transformer block, in block order.
using BlockModes = std::vector<BlockMode>;

struct LlamaModelOptions {
  ModelSpec spec;
  DType dtype = DType::kFloat32;
  torch::Device device = torch::kCPU;  // where the model computes
  // Where parameters are created; default `device`. A managed run creates them on the CPU and
  // lets the ChunkManager place them, so the device never holds the whole model. kMeta: shapes
  // and dtypes only, no values (ParamGroups() and layouts of models too large to materialise).
  std::optional<torch::Device> param_device;
  // [Sharded loading] Parameters on param_device with their shapes and dtype but no memory of
  // their own (every element aliases one zero): a ChunkManager created with deferred_values swaps
  // in the storage of what its rank stores, filled from InitialValues() or a checkpoint. Unlike
  // kMeta, such parameters accept set_data.
  bool deferred_values = false;
  uint64_t seed = 0;  // random init: normal(0, 0.02) for matrices, zeros for biases, ones for norms
  // Tokens per chunk of the LM head + loss ([Chunked head], common/head_chunking.h); a micro-batch
  // of more tokens runs chunked. 0: HeadChunkRows(vocab) and HeadIsChunked(), what the planner
  // assumes.
  int64_t head_chunk_rows = 0;
  // fp32 logit bytes of one head chunk when head_chunk_rows is 0: kHeadChunkLogitBytes (what the
  // planner prices) or, for --plain, kPlainHeadChunkLogitBytes.
  int64_t head_chunk_logit_bytes = kHeadChunkLogitBytes;
  // Tokens per tile of the MLP ([Sequence-tiled MLP], common/mlp_tiling.h): 0: MlpTileRows(), what
  // the planner assumes; > 0: tiles of that many tokens whenever a micro-batch has more; < 0:
  // never tiled.
  int64_t mlp_tile_rows = 0;
  // How the sparse layers run their experts ([Grouped experts], agent/model/moe.h): one grouped
  // GEMM per projection where it runs, or the per-expert loop (for comparisons).
  MoeExperts moe_experts = MoeExperts::kGrouped;
  // A vision-language model's tower recomputes each of its blocks in backward, keeping only the
  // block's input ([Vision block checkpointing], agent/model/vision_tower.cc); the planner's
  // ResidencyPlan::vision_checkpoint.
  bool vision_checkpoint = false;
  // LoRA adapters (rank > 0): every base parameter is frozen (requires_grad false: no gradient,
  // no optimizer state) and each targeted projection of every block computes
  // base(x) + B(A(dropout(x))) * alpha / rank, as PEFT's LoraLayer. A is drawn kaiming-uniform
  // (a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))) from `seed`, B is zero. See [LoRA] in the .cc.
  // lora.nf4_base (QLoRA): every block's projection weights are NF4 ([QLoRA quantized weights],
  // common/nf4_bytes.h), quantized from their model-dtype values when created (on `device`) or
  // loaded (LoadQuantizedWeight), and dequantized per product; ParamGroups() lists their parts.
  // With deferred_values the parts have no values yet ([Sharded NF4 loading]).
  LoraOptions lora;
  // [OSFT] (agent/model/osft.h): the targeted projections are split by SVD when SplitOsft() runs
  // (after the weights are loaded); the base is frozen, the low factors train. Not with LoRA.
  OsftOptions osft;
};

// Not thread-safe: one training thread drives forward and backward.
class LlamaModel {
 public:
  // Validates the spec (common/validate.h rules plus divisibility of heads) and initialises every
  // parameter deterministically from options.seed (same values on every device and dtype).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const LlamaModelOptions& options);

  const ModelSpec& spec() const { return options_.spec; }
  const LlamaModelOptions& options() const { return options_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int num_groups() const { return num_blocks() + 2; }

  // Groups in execution order: 0 = embedding, 1..N = blocks, N+1 = final norm (+ lm_head when
  // untied; a tied head lists model.embed_tokens.weight again, the same tensor); parameters in
  // [Parameter order] (common/param_shapes.h), the order the planner packs chunks in.
  // QLoRA: each quantized weight is listed as its three NF4 parts in its place
  // (QloraBaseLayoutParams, common/nf4_bytes.h).
  memplan::ParamGroups ParamGroups() const;
  // Every parameter once, in first-use order of ParamGroups() (the canonical optimizer order).
  std::vector<NamedParam> Params() const;
  bool has_lora() const { return options_.lora.enabled(); }
  bool has_nf4_base() const { return options_.lora.nf4_base; }
  bool has_osft() const { return options_.osft.enabled(); }
  bool osft_split() const { return osft_split_; }
  // [OSFT] Replaces each targeted projection weight by its SVD factors (fp32 SVD on the model
  // device): ParamGroups() then lists the frozen high factors in the weight's place,
  // AdapterGroups() and TrainableParams() the low ones. Once, after loading the weights.
  absl::Status SplitOsft();
  // [OSFT resume without the SVD] Instead of SplitOsft(), for a resume whose checkpoint holds
  // every factor: the same factors in shape, dtype, device and trainability (OsftZeroFactors),
  // zero-filled until the checkpoint's values are copied in; the dense weights are dropped
  // unread. Once.
  absl::Status ShapeOsftFactors();
  // How the factors were made: projections split by SVD, projections shaped for a checkpoint,
  // and the seconds that took (all 0 before SplitOsft() or ShapeOsftFactors()).
  struct OsftFactorOrigin {
    int svd_splits = 0;
    int shaped = 0;
    double seconds = 0;
  };
  const OsftFactorOrigin& osft_factor_origin() const { return osft_origin_; }
  // [OSFT] Projects the low factors' accumulated gradients orthogonal to the frozen subspaces.
  void ProjectOsftGrads();
  // QLoRA: the Hugging Face names of the quantized weights (block order, kLoraModuleNames order);
  // empty otherwise.
  std::vector<std::string> QuantizedWeightNames() const;
  // QLoRA: quantizes `value` (a checkpoint's weight, any floating dtype; converted to the model
  // dtype first, as a bf16 checkpoint holds it) into the parts of weight `name`, in place. Before
  // a ChunkManager takes the parameters. NOT_FOUND for a name QuantizedWeightNames() lacks,
  // INVALID_ARGUMENT for a wrong shape.
  absl::Status LoadQuantizedWeight(const std::string& name, const torch::Tensor& value);
  // [Sharded NF4 loading] A model created with deferred_values has its NF4 parts without values
  // (the chunk managers' loader fills what each rank stores) and every offset 0: this sets the
  // offset (absmax mean) of weight `name`. NOT_FOUND as LoadQuantizedWeight.
  absl::Status SetQuantizedOffset(const std::string& name, float offset);
  // `base` (values of Params() by name, e.g. a frozen ChunkManager's Params()) with each
  // quantized weight's NF4 parts replaced by the weight dequantized in the model dtype under its
  // Hugging Face name (what merging adapters into a checkpoint needs); other entries unchanged,
  // so without an NF4 base `base` comes back as it is.
  absl::StatusOr<std::vector<NamedParam>> DequantizedBase(const std::vector<NamedParam>& base) const;
  // LoRA adapters per group, num_groups() lists (embedding and head: empty); per block the
  // targeted projections in kLoraModuleNames order, lora_A then lora_B, named like PEFT's
  // parameters without its wrapper prefix: "model.layers.3.self_attn.q_proj.lora_A.weight".
  // Empty lists without LoRA.
  memplan::ParamGroups AdapterGroups() const;
  // What the optimizer updates: the adapters with LoRA (AdapterGroups() flattened), else Params().
  std::vector<NamedParam> TrainableParams() const;
  // Elements [begin, begin + len) of the flattened initial value of base parameter `name` (one
  // of Params(), or a quantized weight by its Hugging Face name, before quantization), in the
  // model dtype on the CPU: exactly what Create gives it, for a model created
  // on kMeta or with deferred_values too. [Sharded loading] a rank fills only what it stores;
  // only the draw's segments around the range are drawn ([Segmented draws]). NOT_FOUND for
  // another name.
  absl::StatusOr<torch::Tensor> InitialValues(const std::string& name, int64_t begin,
                                              int64_t len) const;

  // Reference: plain autograd, all activations kept. Mean cross-entropy of the logits at position t
  // against targets[t] (-100 ignored), computed in fp32: targets are already shifted, as the token
  // batcher makes them and as Hugging Face's `shift_labels` takes them (HF's `labels` = input_ids
  // corresponds to targets[t] = input_ids[t + 1], -100 at the end). input_ids/targets: int64
  // [batch, seq] on the device. Throws for a sequence that CheckSequenceLength refuses.
  // [Vision-language inputs] `images`: the micro-batch's images, for a model with a vision tower.
  torch::Tensor Loss(const torch::Tensor& input_ids, const torch::Tensor& targets,
                     const VisionInputs& images = {});
  // Plain autograd forward to the LM head's output, [batch, seq, vocab] in the model dtype.
  torch::Tensor Logits(const torch::Tensor& input_ids, const VisionInputs& images = {});
  // INVALID_ARGUMENT for a sequence length out of range or a sliding window out of range (naming
  // config.json's "sliding_window"); sequences beyond the window are computed exactly.
  absl::Status CheckSequenceLength(int64_t seq_len) const;
  // Grouped: every group runs in its own autograd Function (agent/blocks/group_runner.h) with the
  // given per-block modes; `residency` (may be null) is told when each group runs. SWAP and
  // HS_OFFLOAD need `offloader` (a default one for the model's device is created if null).
  // Gives bit-identical loss and gradients to Loss() when the device arithmetic is deterministic.
  // The vision tower runs in group 0, with the embedding.
  torch::Tensor Loss(const torch::Tensor& input_ids, const torch::Tensor& targets,
                     const BlockModes& modes, ParamResidency* residency,
                     ActivationOffloader* offloader = nullptr, const VisionInputs& images = {});

  ~LlamaModel();

 private:
  struct BlockParams;
  struct Rope {
    torch::Tensor cos;  // [seq, head_dim], model dtype
    // sin with its first half negated: x * cos + SwapHalves(x) * sin is transformers'
    // x * cos + rotate_half(x) * sin, bit for bit (negation is exact).
    torch::Tensor sin;
    // Gemma 3's sliding layers (rope_local_base_freq > 0), else undefined.
    torch::Tensor local_cos, local_sin;
  };

  // How Create initialises one base parameter: normal(0, 0.02) from generator `draw`, or
  // constant.
  struct InitRecipe {
    enum Kind { kNormal, kOnes, kZeros } kind;
    std::vector<int64_t> sizes;
    int64_t draw;  // kNormal: index of its generator (seeded by options.seed and draw)
  };

  explicit LlamaModel(const LlamaModelOptions& options);
  void InitParams();
  // fp32 normal(0, 0.02) draw number k of `sizes` ([Segmented draws] in llama_model.cc).
  torch::Tensor DrawNormal(const std::vector<int64_t>& sizes, int64_t k) const;
  // The seed of draw number k.
  uint64_t DrawSeed(int64_t k) const;
  // [QLoRA] `value` in NF4, quantized on options.device, parts on the parameter device.
  quant::Nf4Tensor QuantizeBaseWeight(const torch::Tensor& value) const;
  void InitAdapters();
  // Both [OSFT] ways to the factors: by SVD of the loaded weights or zero-filled for a checkpoint.
  absl::Status MakeOsftFactors(bool svd);
  // `mrope_positions` ([3, batch, seq], MropePositions): a vision-language model's multimodal
  // rotary embedding, cos/sin [batch, 1, seq, head_dim].
  Rope MakeRope(int64_t seq_len, const torch::Tensor& mrope_positions = torch::Tensor()) const;
  // The rotary embedding of a forward over `input_ids` (with `images` for a vision-language model).
  Rope InputRope(const torch::Tensor& input_ids, const VisionInputs& images) const;
  torch::Tensor Embed(const torch::Tensor& input_ids, const torch::Tensor& weight) const;
  // The token embeddings with the vision tower's features of `images` at the image tokens.
  torch::Tensor EmbedInputs(const torch::Tensor& input_ids, const torch::Tensor& weight,
                            const VisionInputs& images) const;
  // `train`: LoRA dropout active (training); Logits() runs without it, like PEFT in eval mode.
  // `router_loss` (may be null) collects a sparse layer's routing for the load-balancing loss.
  torch::Tensor Block(const BlockParams& p, const torch::Tensor& hidden, const Rope& rope,
                      bool train, MoeRouterLoss* router_loss = nullptr) const;
  // The gated MLP down(act(gate(y)) * up(y)) of every dense block (act: SiLU, or GELU with the tanh
  // approximation for Gemma), sequence-tiled when MlpTileRows() says so ([Sequence-tiled MLP]).
  torch::Tensor GatedMlp(const BlockParams& p, const torch::Tensor& y, bool gelu_tanh,
                         double dropout, double scaling) const;
  // [Gemma 2] (llama_model_gemma.cc): the block (four norms, Gemma 3's q/k norms and local RoPE,
  // soft-capped attention in tiles,
  // GeGLU MLP), the scaled embedding lookup with its padding row, and for every family the final
  // norm and the logits' soft cap (identity unless final_logit_softcapping).
  torch::Tensor GemmaBlock(const BlockParams& p, const torch::Tensor& hidden, const Rope& rope,
                           double dropout, double scaling) const;
  torch::Tensor GemmaEmbed(const torch::Tensor& input_ids, const torch::Tensor& weight) const;
  torch::Tensor FinalNorm(const torch::Tensor& hidden) const;
  torch::Tensor CapLogits(const torch::Tensor& logits) const;
  torch::Tensor HeadLoss(const torch::Tensor& hidden, const torch::Tensor& targets,
                         const torch::Tensor& head_weight) const;

  LlamaModelOptions options_;
  std::map<std::string, InitRecipe> init_recipes_;  // by Params() name
  torch::Tensor embed_tokens_;
  std::vector<std::unique_ptr<BlockParams>> blocks_;
  torch::Tensor norm_;
  torch::Tensor lm_head_;  // undefined when tied
  std::unique_ptr<VisionParams> vision_;  // vision-language models only
  std::unique_ptr<ActivationOffloader> default_offloader_;
  bool osft_split_ = false;
  OsftFactorOrigin osft_origin_;
};

}  // namespace memplan
