#include "planner/cost/analytic_trace.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/head_chunking.h"
#include "common/mlp_tiling.h"
#include "common/nf4_bytes.h"
#include "common/sliding_window.h"
#include "common/softcap_attention.h"
#include "common/status.h"
#include "common/validate.h"
#include "common/vision_cost.h"
#include "planner/cost/osft_terms.h"

namespace memplan {
namespace {

// A (non-Gemma) RMSNorm's backward holds fp32 temporaries of 12 bytes a value of its input: the
// widened input, the normalised value and the gradient being formed. The blocks' norms and the
// final norm before the head.
constexpr int64_t kNormBackwardBytesPerValue = 12;

struct LoraTargets {
  bool q = false, k = false, v = false, o = false, gate = false, up = false, down = false;
};

LoraTargets TargetsOf(const TrainingMethod& training) {
  LoraTargets t;
  for (const std::string& name : training.lora_target_modules) {
    if (name == "q_proj") t.q = true;
    if (name == "k_proj") t.k = true;
    if (name == "v_proj") t.v = true;
    if (name == "o_proj") t.o = true;
    if (name == "gate_proj") t.gate = true;
    if (name == "up_proj") t.up = true;
    if (name == "down_proj") t.down = true;
  }
  return t;
}

double MatmulRate(const HardwareSpec& hw, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return hw.matmul_fp32_flops;
    case DType::kFloat16:
      return hw.matmul_fp16_flops > 0 ? hw.matmul_fp16_flops : hw.matmul_bf16_flops;
    case DType::kBFloat16:
      return hw.matmul_bf16_flops;
  }
  return hw.matmul_bf16_flops;
}

// Scaled byte figure, saturated at 2^60 so that absurd scale factors cannot overflow.
int64_t Scale(int64_t bytes, double factor) {
  const double v = std::ceil(static_cast<double>(bytes) * factor);
  constexpr double kCap = 1152921504606846976.0;  // 2^60
  return v >= kCap ? static_cast<int64_t>(kCap) : static_cast<int64_t>(v);
}

// [Fused norm] Per-token bytes an RMSNorm of `width` keeps for backward (model dtype d bytes;
// agent/model/layers.cc, RmsNorm): its input unless something else keeps it already
// (`input_kept`), the output when the following linears need their input, and the fp32 rstd; an
// fp32 model's norm is the eager graph, which also keeps the normalised value when the weight
// trains.
int64_t NormSavedBytes(int64_t width, int64_t d, bool input_kept, bool out_needed,
                       bool weight_trains) {
  return (input_kept ? 0 : d * width) + (out_needed ? d * width : 0) + 4 +
         (d == 4 && weight_trains ? 4 * width : 0);
}

// [Gemma 2 block price] Per-token bytes a Gemma2RMSNorm of `width` keeps (agent/model/
// llama_model_gemma.cc): the fp32 view of its input (a copy for 16-bit models; for fp32 the input
// itself, counted here unless something else already keeps it, `input_kept`), the fp32 normalised
// value when the weight trains (the (1 + weight) product keeps it), the output when the following
// linears need it, and the fp32 rstd.
int64_t GemmaNormSavedBytes(int64_t width, int64_t d, bool input_kept, bool weight_trains,
                            bool out_needed) {
  return (d < 4 || !input_kept ? 4 * width : 0) + (weight_trains ? 4 * width : 0) +
         (out_needed ? d * width : 0) + 4;
}

// The head group's memory: final norm, LM head, cross-entropy (model dtype d bytes, T tokens).
struct HeadBytes {
  int64_t saved = 0;
  int64_t forward_transient = 0;
  int64_t backward_transient = 0;
};

HeadBytes HeadMemory(const ModelSpec& arch, DType dtype, bool full, int64_t tokens, bool chunked,
                     int64_t logit_bytes = kHeadChunkLogitBytes) {
  const int64_t d = DTypeBytes(dtype);
  const bool narrow = d < 4;
  const int64_t h = arch.hidden_size;
  const int64_t vocab = arch.vocab_size;
  const bool head_trains = full;  // LM head weight (or tied embedding) trains
  // The final RMSNorm, as the blocks' norms.
  auto norm_saved = [&](bool out_needed) {
    // The input is the last block's output, which nothing else keeps.
    return arch.IsGemma() ? GemmaNormSavedBytes(h, d, true, full, out_needed)
                          : NormSavedBytes(h, d, /*input_kept=*/false, out_needed, full);
  };
  HeadBytes b;
  if (chunked) {
    // [Chunked head] (common/head_chunking.h): one row chunk's logits at a time; the loss
    // gradients of the head's input and weight are made in forward and held until backward (the
    // head keeps no input of its own). Norm backward temporaries as in the plain case.
    const ChunkedHeadBytes c = ChunkedHeadMemory(h, vocab, d, tokens, head_trains, logit_bytes);
    b.saved = tokens * norm_saved(false) + c.saved + tokens * 8;
    b.forward_transient = c.forward_transient + tokens * 8;
    // Gemma 2's final soft cap: per chunk the tanh in the dtype and its fp32 derivative.
    if (arch.final_logit_softcapping > 0) {
      b.forward_transient += std::min(tokens, HeadChunkRows(vocab, logit_bytes)) * vocab * (d + 12);
    }
    // [Head backward in two stages] The head's own backward (the weight gradient's cast), then
    // the final norm's: its fp32 temporaries (kNormBackwardBytesPerValue, as a block's norm) and
    // the input gradient it writes beside the incoming one (the head's, in `saved`), by then
    // without the fp32 weight-gradient sum. The two never overlap: the larger is the head's
    // transient.
    b.backward_transient =
        std::max(c.backward_transient,
                 tokens * (kNormBackwardBytesPerValue * h + d * h) - c.freed_by_backward);
    return b;
  }
  // Plain: logits [T, V] in dtype (kept by the model output), an fp32 upcast for the loss
  // (transient) and log_softmax's fp32 output (kept for backward). Backward holds fp32 grad of
  // log_softmax output and of its input together, plus the LM head's weight gradient [V, H],
  // materialised before it reaches its chunk.
  const int64_t tv = tokens * vocab;
  b.saved = tokens * norm_saved(head_trains) + tv * d + tv * 4 + tokens * 8;
  b.forward_transient = (narrow ? tv * 4 : 0) + tokens * 8;
  b.backward_transient = 8 * tv + 2 * tokens * h * d + tokens * kNormBackwardBytesPerValue * h +
                         (head_trains ? vocab * h * d : 0);
  // Gemma 2's final soft cap keeps the tanh output; backward passes two more [T, V] gradients.
  if (arch.final_logit_softcapping > 0) {
    b.saved += tv * d;
    b.forward_transient += tv * d;
    b.backward_transient += 2 * tv * d;
  }
  return b;
}

// The head group's forward and backward seconds (T tokens) at the head's matmul and HBM rates.
struct HeadSeconds {
  double forward = 0;
  double backward = 0;
};

HeadSeconds HeadTime(const ModelSpec& arch, DType dtype, bool full, int64_t tokens, bool chunked,
                     int64_t logit_bytes, double matmul_rate, double hbm_rate) {
  const int64_t d = DTypeBytes(dtype);
  const int64_t h = arch.hidden_size;
  const int64_t vocab = arch.vocab_size;
  const bool head_trains = full;  // LM head weight (or tied embedding) trains
  const double t = static_cast<double>(tokens);
  const double tv = t * static_cast<double>(vocab);
  const double head_flops = 2.0 * t * static_cast<double>(h) * static_cast<double>(vocab);
  HeadSeconds s;
  if (chunked) {
    // Every GEMM of the head runs in forward (logits, input gradient, weight gradient) along
    // with the elementwise passes over each chunk's logits and, per chunk, the weight-gradient
    // product's add into the fp32 sum ([Head chunk sums]); backward only scales the gradients.
    const double gemms = head_trains ? 3.0 : 2.0;
    const double chunk_mem = tv * static_cast<double>(3 * d + 24);
    const double sums =
        head_trains ? static_cast<double>(HeadChunkSumBytes(tokens, vocab, h, logit_bytes)) : 0.0;
    s.forward = gemms * head_flops / matmul_rate + (chunk_mem + sums) / hbm_rate;
    s.backward =
        static_cast<double>(2 * tokens * h * d + (head_trains ? vocab * h * (4 + 2 * d) : 0)) /
        hbm_rate;
  } else {
    const double head_fwd_mem = tv * static_cast<double>(d + 12);
    const double head_bwd_mem = tv * static_cast<double>(d + 16);
    s.forward = head_flops / matmul_rate + head_fwd_mem / hbm_rate;
    s.backward = (head_trains ? 2.0 : 1.0) * head_flops / matmul_rate + head_bwd_mem / hbm_rate;
  }
  return s;
}

// [Sequence-tiled MLP] Per-token bytes a dense block keeps for its MLP beside the norm's output:
// whole, the gate and up outputs ([Fused gate]: agent/model/layers.cc, GatedProductFunction,
// recomputes the activation in backward) and the product when down_proj trains; tiled, only the
// MLP's input, when no training gate or up linear keeps it already.
int64_t MlpSavedPerToken(int64_t d, int64_t h, int64_t inter, bool gate_up_train, bool down_trains,
                         bool tiled) {
  if (tiled) return gate_up_train ? 0 : d * h;
  return 2 * d * inter + (down_trains ? d * inter : 0);
}

// [Sparse layer price] What agent/model/moe.cc's MoeMlp keeps, allocates and moves for T tokens,
// E experts, top k, expert width I, hidden H, model dtype d bytes (docs/cost-model.md, "Mixtures
// of experts"), on its grouped path ([Grouped experts]: one grouped GEMM per projection over all
// experts; what runs on CPUs and, in bf16, on compute capability 9.x/10.x). Routed rows: each
// token goes to k distinct experts, so T * k rows in total whatever the balance, and the grouped
// GEMMs compute them all at once: no term depends on how the rows spread over the experts.
struct SparseLayerTerms {
  int64_t saved_per_token = 0;     // beyond the router's input, which the caller counts
  int64_t forward_transient = 0;   // whole micro-batch, the layer's output included
  int64_t backward_transient = 0;  // whole micro-batch, beyond the incoming gradients
  double forward_traffic = 0;      // bytes copied by routing, beyond the saved tensors
  double backward_traffic = 0;     // bytes moved by routing's gradients
  double stack_traffic = 0;        // bytes moved stacking the experts' weights, in each pass
};

// One projection's weights of every expert stacked [E, I, H] for its grouped GEMM (the experts are
// separate parameters), dropped after the product; in backward the stack again, then the [E, I, H]
// weight gradient, one at a time. The one sparse-layer transient that does not grow with T.
int64_t SparseLayerStackedBytes(const ModelSpec& arch, int64_t d) {
  return arch.num_experts * arch.moe_intermediate_size * arch.hidden_size * d;
}

// `trains`: the router's and the experts' weights train (a full fine-tune; a LoRA run freezes
// them, adapters going on attention only: CheckMoeAdapters).
SparseLayerTerms SparseLayerMemory(const ModelSpec& arch, int64_t d, int64_t tokens, bool trains) {
  const int64_t h = arch.hidden_size;
  const int64_t e = arch.num_experts;
  const int64_t k = arch.num_experts_per_tok;
  const int64_t inter = arch.moe_intermediate_size;
  const bool mixtral = arch.family == "mixtral";
  SparseLayerTerms s;
  // Saved per token: the fp32 softmax [T, E] (softmax's output, also the load-balancing hook's),
  // the int64 top-k indices, the stable sort's order and its inverse permutation ([T * k] each,
  // kept by index_select), the fp32 top-k weights and their sum when renormalised (the division
  // keeps both), each routed row's gate and up outputs ([Fused gate]), the expert outputs and
  // the per-row routing weights (the weighting product keeps both; fp32 for Mixtral, the model
  // dtype for Qwen3-MoE); when the experts train, the sorted token copies [T * k, H] (the gate/up
  // input) and the gate/up product (the down projection's input) too ([Frozen linear]: the
  // expert linears keep their input only for their weights' gradients).
  s.saved_per_token = 4 * e + 3 * 8 * k + (arch.norm_topk_prob ? 4 * k + 4 : 0) +
                      (trains ? d * k * h + d * k * inter : 0) + 2 * d * k * inter + d * k * h +
                      (mixtral ? 4 * k : d * k);
  const int64_t stacked = SparseLayerStackedBytes(arch, d);
  // Forward: the router logits in the dtype and the tokens repeated k times before sorting live to
  // the end of MoeMlp; beside them either a projection's stacked weights (during a GEMM) or, at the
  // end, the weighted rows, those rows put back in token order and the summed output (Mixtral
  // weights in fp32: its product [T * k, H] in fp32 sits beside the cast for a moment).
  s.forward_transient =
      tokens * (d * e + d * k * h) +
      std::max(stacked,
               tokens * std::max(2 * d * k * h + d * h, mixtral ? (4 + d) * k * h : int64_t{0}));
  // Backward: fp32 routing gradients for Mixtral and the softmax gradients; the up and gate
  // projections' backward, bounded together: two intermediates' gradients [T * k, I] (SiLU's and
  // up's, or the gate's) and two input gradients [T * k, H] (one waiting to be summed with the
  // other into the sorted rows'), beside the stacked weights or their gradient.
  s.backward_transient = tokens * ((mixtral ? 8 * k * h : 0) + 8 * e) +
                         tokens * k * (2 * d * inter + 2 * d * h) + stacked;
  // Routing copies in forward: the repeated tokens (written, read by the sort's gather), the
  // weighted rows and their un-permuted copy (written and read): 6 passes over the routed rows.
  // The stable sort moves T * k int64 keys and indices, a few passes of 16 bytes a row against the
  // rows' H * d: left out.
  const double rows_bytes = static_cast<double>(tokens) * static_cast<double>(d * k * h);
  s.forward_traffic = 6.0 * rows_bytes;
  // Backward: the two gathers' gradients (a zero-filled [T * k, H] each, the rows added in); the
  // grouped GEMMs write the experts' input gradients whole, with no concatenation. The GEMMs
  // themselves (weight gradients included) are priced as flops.
  s.backward_traffic = 4.0 * rows_bytes;
  // Each of the three projections' weights read and written into their stack, once in forward
  // (and its recompute) and once in backward; not scaled with the saved bytes as the routing is.
  s.stack_traffic = 3.0 * 2.0 * static_cast<double>(stacked);
  return s;
}

// The embedding group's activation bytes: the lookup, and a vision-language model's tower with
// its images ([Vision tower price]): the tower runs in this group (LlamaModel::EmbedInputs), its
// pixel values and saved set live to the group's backward, and its transients come on top of the
// token embeddings.
struct EmbeddingBytes {
  int64_t saved = 0;
  int64_t forward_transient = 0;
  int64_t backward_transient = 0;
};

EmbeddingBytes EmbeddingMemory(const ModelSpec& arch, const Workload& workload, DType dtype,
                               bool full) {
  const int64_t d = DTypeBytes(dtype);
  const int64_t tokens = workload.micro_batch * workload.seq_len;
  const int64_t embeds = tokens * arch.hidden_size * d;
  // The lookup keeps only the int64 ids; its output is the first block's input.
  // [Fresh embedding grad] Its backward writes a new [vocab, hidden] grad in the model dtype
  // (embedding_dense_backward), which the chunk's grad takes in afterwards: beside every
  // persistent grad at the end of backward. Small all-persistent steps of tied models peak there:
  // on an H200, qwen2.5-3b 1x768 ran 1 188 MiB above the allocated bytes before the embedding's
  // backward (two of its 594 MiB grads) and llama-3.2-1b 1x512 561 MiB above the plan (one of
  // 501), each under by about one such grad (docs/benchmarks.md, twenty-sixth session).
  const int64_t fresh_grad = full ? arch.vocab_size * arch.hidden_size * d : 0;
  EmbeddingBytes b{full ? tokens * 8 : 0, embeds,
                   full ? tokens * arch.hidden_size * (d + 4) + fresh_grad : 0};
  if (!arch.IsVisionLanguage() || workload.images_per_sample < 1) return b;
  const VisionTowerCost tower = VisionTowerCostFor(
      arch, workload.micro_batch * workload.images_per_sample, workload.image_height,
      workload.image_width, dtype, full, workload.vision_checkpoint);
  // A trained embedding's masked_scatter keeps the image-token mask (one bool per token).
  b.saved += tower.pixel_bytes + tower.saved_bytes + (full ? tokens : 0);
  // Then the scatter: the token embeddings, the tower's output, the mask and the result.
  b.forward_transient = std::max({b.forward_transient, embeds + tower.forward_transient_bytes,
                                  2 * embeds + tower.output_bytes + tokens});
  if (full) {
    // The scatter's backward: the embeddings' gradient beside the incoming one, then the tower's.
    b.backward_transient =
        std::max(b.backward_transient,
                 2 * embeds + tower.output_bytes + tower.backward_transient_bytes + fresh_grad);
  }
  return b;
}

}  // namespace

absl::StatusOr<Trace> SynthesizeTrace(const ModelSpec& arch, const Workload& workload,
                                      DType param_dtype, const TrainingMethod& training,
                                      const HardwareSpec& hardware,
                                      const AnalyticTraceOptions& options) {
  RETURN_IF_ERROR(ValidateModelSpec(arch, "arch."));
  RETURN_IF_ERROR(ValidateWorkload(workload, "workload."));
  RETURN_IF_ERROR(ValidateTrainingMethod(training, arch, "training."));
  RETURN_IF_ERROR(ValidateImagesForModel(arch, workload, "arch.", "workload."));
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"matmul_efficiency", options.matmul_efficiency},
        {"hbm_efficiency", options.hbm_efficiency},
        {"block_gemm_efficiency", options.block_gemm_efficiency},
        {"attention_efficiency", options.attention_efficiency},
        {"block_hbm_efficiency", options.block_hbm_efficiency},
        {"adapter_hbm_efficiency", options.adapter_hbm_efficiency}}) {
    if (!(value > 0 && value <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("analytic options.", name, " = ", value, " must be in (0, 1]"));
    }
  }
  if (!(options.block_forward_floor_seconds >= 0) || !(options.block_backward_floor_seconds >= 0) ||
      !(options.host_overlap_exponent == 0 || options.host_overlap_exponent >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "analytic options: block floors (", options.block_forward_floor_seconds, ", ",
        options.block_backward_floor_seconds, " s) must be >= 0 and host_overlap_exponent (",
        options.host_overlap_exponent, ") 0 (the larger) or >= 1"));
  }
  const double matmul_rate = MatmulRate(hardware, param_dtype) * options.matmul_efficiency;
  const double hbm_rate = hardware.hbm_bytes_per_second * options.hbm_efficiency;
  if (!(matmul_rate > 0) || !(hbm_rate > 0)) {
    return absl::InvalidArgumentError(
        "hardware matmul and hbm rates must be positive to synthesise a trace");
  }
  // [Block time]: the dense blocks' rates, from what the card achieves.
  const double achievable_matmul =
      MatmulRate(hardware, param_dtype) * (hardware.measured ? 1.0 : kPresetMatmulAchieved);
  const double lin_rate = achievable_matmul * options.block_gemm_efficiency;
  const double attn_rate = achievable_matmul * options.attention_efficiency;
  const double achievable_hbm =
      hardware.hbm_bytes_per_second * (hardware.measured ? 1.0 : kPresetHbmAchieved);
  const double block_hbm_rate = achievable_hbm * options.block_hbm_efficiency;
  const double adapter_hbm_rate = achievable_hbm * options.adapter_hbm_efficiency;

  // All sizes in elements or bytes per token unless stated; T = tokens per micro-batch.
  const int64_t d = DTypeBytes(param_dtype);
  const int64_t h = arch.hidden_size;
  const int64_t hd = arch.HeadDim();
  const int64_t hq = arch.num_heads * hd;
  const int64_t hkv = arch.num_kv_heads * hd;
  const int64_t inter = arch.intermediate_size;
  const int64_t vocab = arch.vocab_size;
  const int64_t seq = workload.seq_len;
  const int64_t tokens = workload.micro_batch * workload.seq_len;
  const bool full = training.kind == TrainingKind::kFull;
  // [OSFT] priced as a frozen base whose targeted projections keep their inputs (the low factors
  // train), with the factors' own terms (planner/cost/osft_terms.h) on top.
  const bool osft = training.kind == TrainingKind::kOsft;
  OsftBlockTerms osft_terms;
  if (osft) {
    ASSIGN_OR_RETURN(osft_terms, OsftBlockTermsFor(arch, training, param_dtype));
  }
  TrainingMethod targets_of = training;
  if (osft) targets_of.lora_target_modules = OsftTargetModules(training);
  const LoraTargets lora = full ? LoraTargets{} : TargetsOf(targets_of);
  const int64_t rank = full || osft ? 0 : training.lora_rank;

  // A linear keeps its input for backward only when its weight (or an adapter on it) trains.
  const bool q_in = full || lora.q, k_in = full || lora.k, v_in = full || lora.v;
  const bool gate_in = full || lora.gate, up_in = full || lora.up, down_in = full || lora.down;

  // [Fused norm] RMSNorm keeps its input, its fp32 rstd, and its output is kept by the following
  // linears when they need their input (NormSavedBytes).
  auto norm_saved = [&](int64_t width, bool input_kept, bool out_needed) {
    return NormSavedBytes(width, d, input_kept, out_needed, full);
  };

  // ---- per-token saved bytes of one block (derivation in docs/cost-model.md) ----
  int64_t saved_tok = d * h;  // block input (residual stream)
  // input_layernorm: its input is the block input, counted above.
  saved_tok += norm_saved(h, /*input_kept=*/true, q_in || k_in || v_in);
  if (arch.qk_norm) {
    // Per-head RMSNorm on q and k: the projections' outputs (kept by nothing else; RoPE keeps
    // only its tables) and one fp32 rstd per head (fp32: and the normalised values, as above).
    saved_tok += d * (hq + hkv) + 4 * (arch.num_heads + arch.num_kv_heads) +
                 (d == 4 && full ? 4 * (hq + hkv) : 0);
  }
  saved_tok += d * (hq + 2 * hkv);           // q, k after RoPE, v (SDPA inputs)
  saved_tok += d * hq + 4 * arch.num_heads;  // attention output + logsumexp
  const int64_t attn_saved_tok = saved_tok;  // what a sparse layer keeps up to its MLP
  // post_attention_layernorm: its input, the residual after attention, is kept by nothing else.
  saved_tok += norm_saved(h, /*input_kept=*/false, gate_in || up_in);
  // [Sequence-tiled MLP] (common/mlp_tiling.h): a tile's intermediates are transient.
  const int64_t mlp_tile = MlpTileRows(tokens, inter, d);
  const bool mlp_tiled = MlpIsTiled(tokens, inter, d);
  saved_tok += MlpSavedPerToken(d, h, inter, gate_in || up_in, down_in, mlp_tiled);
  const int lora_modules = lora.q + lora.k + lora.v + lora.o + lora.gate + lora.up + lora.down;
  saved_tok += lora_modules * d * rank;  // adapter B inputs (A x)
  saved_tok += osft_terms.saved_bytes_per_token;
  if (arch.IsGemma()) {
    // [Gemma 2 block price] The block input, its four norms (GemmaNormSavedBytes: the post-
    // attention and post-MLP norms' inputs are the projections' outputs, kept by nothing else,
    // and their outputs go to an addition, which keeps nothing), q, k and v ([Soft-capped
    // attention tiles] keep nothing else: no log-sum-exp, no output), the attention output when
    // o_proj's input is needed, and the GeGLU MLP as SwiGLU's ([Fused gate]: the gate and up
    // outputs, the GELU recomputed in backward).
    auto gnorm = [&](bool input_kept, bool out_needed) {
      return GemmaNormSavedBytes(h, d, input_kept, full, out_needed);
    };
    saved_tok =
        d * h + gnorm(true, q_in || k_in || v_in) + d * (hq + 2 * hkv) +
        (full || lora.o ? d * hq : 0) + gnorm(false, false) + gnorm(false, gate_in || up_in) +
        MlpSavedPerToken(d, h, inter, gate_in || up_in, down_in, MlpIsTiled(tokens, inter, d)) +
        gnorm(false, false) + lora_modules * d * rank + osft_terms.saved_bytes_per_token;
    if (arch.qk_norm) {
      // Gemma 3's q and k norms: per head rows, each norm's input kept by nothing else, and its
      // output consumed by RoPE, which keeps only cos and sin; one fp32 rstd per head.
      saved_tok += GemmaNormSavedBytes(hq, d, false, full, false) +
                   GemmaNormSavedBytes(hkv, d, false, full, false) - 8 +
                   4 * (arch.num_heads + arch.num_kv_heads);
    }
  }

  // Forward transient: a norm's temporaries, plus the block output being written next to the
  // residual. RMSNorm: the fp32 square or normalised value beside the fp32 input, which a 16-bit
  // model's [Fused norm] holds only during forward (12 bytes a value with the cast; fp32 8);
  // Gemma's norm the fp32 input, its square, the normalised value and its (1 + weight) product.
  const int64_t norm_bytes = arch.IsGemma() ? 16 : (d < 4 ? 12 : 8);
  const int64_t norm_tmp =
      std::max(norm_bytes * h, arch.qk_norm ? norm_bytes * (hq + hkv) : int64_t{0});
  const int64_t fwd_tr_tok = norm_tmp + 2 * d * h + osft_terms.transient_bytes_per_token;
  // Backward transient: incoming gradient + residual gradient accumulator, plus the widest of
  // the MLP (the product's gradient beside the gate's and up's), attention (dq, dk, dv and
  // flash's fp32 dq accumulator) and norm (fp32 temporaries) backward.
  const int64_t mlp_bwd = 3 * d * inter + 2 * d * h;
  const int64_t attn_bwd = 2 * d * (hq + 2 * hkv) + 4 * hq + 4 * arch.num_heads;
  const int64_t bwd_tr_tok = 2 * d * h +
                             std::max({mlp_bwd, attn_bwd, kNormBackwardBytesPerValue * h}) +
                             osft_terms.transient_bytes_per_token;
  const int64_t bwd_tr_attn_tok = 2 * d * h + std::max(attn_bwd, kNormBackwardBytesPerValue * h);
  // Tiled: one tile's intermediates in forward; in backward the MLP stage holds the input
  // gradient [T, H] being filled beside the incoming gradients, plus one tile recomputed
  // (its three intermediates: gate, up and their [Fused gate] product) and back-propagated
  // (mlp_bwd per token of the tile).
  const int64_t tile_fwd_tr = mlp_tiled ? mlp_tile * 3 * d * inter : 0;
  const int64_t tiled_bwd_tr =
      mlp_tiled
          ? std::max(tokens * (2 * d * h + std::max(attn_bwd, kNormBackwardBytesPerValue * h)),
                     tokens * 3 * d * h + mlp_tile * (3 * d * inter + mlp_bwd))
          : 0;

  // ---- parameters ----
  const int64_t block_weights = h * hq + 2 * h * hkv + hq * h + 3 * h * inter;
  // Two RMSNorm weights (Gemma 2: four).
  int64_t block_params = block_weights + (arch.IsGemma() ? 4 : 2) * h;
  if (arch.qkv_bias) block_params += hq + 2 * hkv;
  if (arch.qk_norm) block_params += 2 * hd;
  const int64_t adapter_params =
      rank * ((lora.q ? h + hq : 0) + (lora.k ? h + hkv : 0) + (lora.v ? h + hkv : 0) +
              (lora.o ? hq + h : 0) + (lora.gate ? h + inter : 0) + (lora.up ? h + inter : 0) +
              (lora.down ? inter + h : 0));
  block_params += adapter_params + osft_terms.extra_params;
  const int64_t embed_params = vocab * h;
  const int64_t head_params = h + (arch.tie_word_embeddings ? 0 : vocab * h);

  // ---- compute ----
  const double t = static_cast<double>(tokens);
  const double lin_flops = 2.0 * static_cast<double>(block_weights) * t;
  const double attn_flops = 2.0 * static_cast<double>(hq) * static_cast<double>(seq) * t;
  const double lora_flops = 2.0 * static_cast<double>(adapter_params) * t;
  // [Adapter traffic] An adapted projection adds B(A x) * scaling to the base output: forward
  // reads x (A) and writes, scales and adds the output (out + 2 out + 3 out); backward scales
  // the output's gradient (2 out), reads it twice more (B's weight and input gradients), reads x
  // (A's weight gradient), writes x's gradient and adds it to the base path's (in + 3 in).
  // Skinny products and elementwise passes alike: memory-bound, priced at adapter_hbm_rate.
  int64_t adapted_in = 0, adapted_out = 0;
  for (const auto& [on, in, out] : {std::tuple<bool, int64_t, int64_t>{lora.q, h, hq},
                                    {lora.k, h, hkv},
                                    {lora.v, h, hkv},
                                    {lora.o, hq, h},
                                    {lora.gate, h, inter},
                                    {lora.up, h, inter},
                                    {lora.down, inter, h}}) {
    if (!on || rank == 0) continue;
    adapted_in += in;
    adapted_out += out;
  }
  const double adapter_fwd_seconds =
      static_cast<double>(d * (adapted_in + 6 * adapted_out)) * t / adapter_hbm_rate;
  const double adapter_bwd_seconds =
      static_cast<double>(d * (5 * adapted_in + 4 * adapted_out)) * t / adapter_hbm_rate;
  // OSFT: the targets' factorized products in place of their dense ones.
  const double osft_fwd_delta =
      (osft_terms.forward_flops_per_token - osft_terms.dense_forward_flops_per_token) * t;
  const double osft_bwd_delta =
      (osft_terms.backward_flops_per_token - osft_terms.dense_forward_flops_per_token) * t;
  const double fwd_flops = lin_flops + attn_flops + lora_flops + osft_fwd_delta;
  // Backward: grad-input and grad-weight GEMMs for trained weights (2x forward), grad-input
  // only for frozen ones (1x); flash attention backward re-computes scores (2.5x forward).
  const double bwd_flops =
      (full ? 2.0 : 1.0) * lin_flops + 2.5 * attn_flops + 2.0 * lora_flops + osft_bwd_delta;
  const double fwd_mem = 2.0 * static_cast<double>(saved_tok) * t;  // write + read once
  double bwd_mem = 2.0 * fwd_mem;
  // Tiled, backward runs the MLP's forward once more (tile by tile), writing and reading its
  // intermediates.
  const double mlp_recompute_flops = mlp_tiled ? 2.0 * static_cast<double>(3 * h * inter) * t : 0.0;
  if (mlp_tiled) bwd_mem += 2.0 * static_cast<double>(3 * d * inter) * t;

  // QLoRA: the projections are NF4 in the chunks and dequantized one at a time before their
  // matmul, in forward, recompute and again in backward ([Dequantization transient],
  // common/nf4_bytes.h): one model-dtype copy of the largest projection on top of the transients,
  // and each pass reads the NF4 bytes and writes the copies (memory-bound; at the measured
  // dequantization rate when the hardware profile has one).
  const bool qlora = training.kind == TrainingKind::kQlora;
  const int64_t dequant_transient = qlora ? QloraDequantTransient(arch, d).bytes : 0;
  const double dequant_rate =
      hardware.nf4_dequant_bytes_per_second > 0 ? hardware.nf4_dequant_bytes_per_second : hbm_rate;
  const double dequant_seconds =
      qlora ? static_cast<double>(QloraBlockDequantTrafficBytes(arch, d)) / dequant_rate : 0.0;

  Trace trace;
  trace.arch = arch;
  trace.workload = workload;
  trace.param_dtype = param_dtype;
  trace.training = training;
  trace.hardware_name = hardware.name;
  trace.analytic = true;
  trace.trace_id = absl::StrCat("analytic:", arch.name, ":", workload.micro_batch, "x",
                                workload.seq_len, ":", std::string(DTypeName(param_dtype)));
  if (arch.IsVisionLanguage()) {
    absl::StrAppend(&trace.trace_id, ":", workload.images_per_sample, "x", workload.image_height,
                    "x", workload.image_width, "px", workload.vision_checkpoint ? ":vckpt" : "");
  }

  int64_t sparse_block_params = 0;
  BlockTrace block;
  // QLoRA's base: NF4 projections, the rest in the model dtype; adapters in the model dtype.
  block.param_bytes = qlora ? QloraBlockBaseBytes(arch, d) + adapter_params * d : block_params * d;
  block.input_bytes = tokens * h * d;
  block.saved_bytes = tokens * saved_tok;
  block.forward_transient_bytes = tokens * fwd_tr_tok + tile_fwd_tr + dequant_transient;
  block.backward_transient_bytes =
      (mlp_tiled ? tiled_bwd_tr : tokens * bwd_tr_tok) + dequant_transient;
  block.forward_seconds = (fwd_flops - attn_flops) / lin_rate + attn_flops / attn_rate +
                          fwd_mem / block_hbm_rate + dequant_seconds + adapter_fwd_seconds;
  block.backward_seconds = (bwd_flops - 2.5 * attn_flops + mlp_recompute_flops) / lin_rate +
                           2.5 * attn_flops / attn_rate + bwd_mem / block_hbm_rate +
                           dequant_seconds + adapter_bwd_seconds;
  block.recompute_seconds = block.forward_seconds;
  trace.blocks.assign(static_cast<size_t>(arch.num_layers), block);
  if (arch.IsMoe()) {
    // [Sparse layer price] The layers ModelSpec::IsMoeLayer names (the agent's rule) run the
    // router and experts instead of the dense MLP; the others keep the block above.
    const SparseLayerTerms sparse = SparseLayerMemory(arch, d, tokens, full);
    const int64_t k = arch.num_experts_per_tok;
    const int64_t e_inter = arch.moe_intermediate_size;
    const int64_t attn_weights = h * hq + 2 * h * hkv + hq * h;
    int64_t sparse_params =
        attn_weights + 2 * h + h * arch.num_experts + arch.num_experts * 3 * h * e_inter;
    if (arch.qkv_bias) sparse_params += hq + 2 * hkv;
    if (arch.qk_norm) sparse_params += 2 * hd;
    sparse_params += adapter_params;  // attention adapters only (CheckMoeAdapters)
    // The router's input (the post-attention norm's output) is kept when the router trains
    // ([Frozen linear]); nothing else keeps it (the experts take copies of its rows).
    const int64_t sparse_saved_tok = attn_saved_tok + norm_saved(h, /*input_kept=*/false, full) +
                                     sparse.saved_per_token + lora_modules * d * rank;
    // Only the routed rows are computed: the router and top_k experts per token.
    const double active_weights =
        static_cast<double>(attn_weights + h * arch.num_experts + k * 3 * h * e_inter);
    const double sparse_lin_flops = 2.0 * active_weights * t;
    const double sparse_fwd_flops = sparse_lin_flops + attn_flops + lora_flops;
    const double sparse_bwd_flops =
        (full ? 2.0 : 1.0) * sparse_lin_flops + 2.5 * attn_flops + 2.0 * lora_flops;
    const double sparse_fwd_mem =
        2.0 * static_cast<double>(sparse_saved_tok) * t + sparse.forward_traffic;
    const double sparse_bwd_mem = 2.0 * sparse_fwd_mem + sparse.backward_traffic;
    BlockTrace sb;
    sb.param_bytes = sparse_params * d;
    sb.input_bytes = block.input_bytes;
    sb.saved_bytes = tokens * sparse_saved_tok;
    sb.forward_transient_bytes = std::max(tokens * fwd_tr_tok, sparse.forward_transient);
    sb.backward_transient_bytes =
        std::max(tokens * bwd_tr_attn_tok, tokens * 2 * d * h + sparse.backward_transient);
    // [Sparse layer price] The experts' GEMMs run grouped, one per projection over every expert,
    // at the GEMM rate like any other (only the active rows' flops above); beside them the
    // routing's gathers and the stacking of the experts' weights, at the memory rate.
    sb.forward_seconds = sparse_fwd_flops / matmul_rate +
                         (sparse_fwd_mem + sparse.stack_traffic) / hbm_rate + adapter_fwd_seconds;
    sb.backward_seconds = sparse_bwd_flops / matmul_rate +
                          (sparse_bwd_mem + sparse.stack_traffic) / hbm_rate + adapter_bwd_seconds;
    sb.recompute_seconds = sb.forward_seconds;
    for (int64_t l = 0; l < arch.num_layers; ++l) {
      if (arch.IsMoeLayer(l)) trace.blocks[static_cast<size_t>(l)] = sb;
    }
    sparse_block_params = sparse_params;
  }
  // [Sliding-window tiles] (common/sliding_window.h): a layer whose window is shorter than the
  // sequence runs its attention in query tiles. Beside the incoming gradients and the output's
  // gradient, its attention step holds the tiles' bytes rather than flash attention's; the block
  // is priced at the larger of the two. Each query scores a tile's W + T - 1 keys (masked ones
  // too, no causal halving), and backward recomputes every tile before back-propagating it. The
  // memory-efficient kernel that takes the mask ran those flops at 0.41-0.47 of flash attention's
  // rate on an H200 (bf16, 8 K-32 K tokens, W 1500-4096: 212-259 against 520-554 TFLOP/s
  // counted this way), hence kTiledAttentionSlowdown.
  constexpr double kTiledAttentionSlowdown = 2.3;
  for (int64_t l = 0; l < arch.num_layers && !arch.IsGemma(); ++l) {
    const int64_t window = arch.LayerWindow(l);
    const SlidingWindowAttentionBytes tiles =
        SlidingWindowAttentionMemory(arch, window, workload.micro_batch, seq, d);
    if (tiles.backward_transient == 0) continue;
    BlockTrace& b = trace.blocks[static_cast<size_t>(l)];
    const int64_t beside = tokens * (2 * d * h + d * hq) + dequant_transient;
    b.forward_transient_bytes =
        std::max(b.forward_transient_bytes, beside + tiles.forward_transient);
    b.backward_transient_bytes =
        std::max(b.backward_transient_bytes, beside + tiles.backward_transient);
    const int64_t keys = std::min(seq, window + SlidingWindowTileRows(window) - 1);
    const double tiled_flops =
        kTiledAttentionSlowdown * 4.0 * static_cast<double>(hq) * static_cast<double>(keys) * t;
    b.forward_seconds += (tiled_flops - attn_flops) / attn_rate;
    b.backward_seconds += (3.5 * tiled_flops - 2.5 * attn_flops) / attn_rate;
    b.recompute_seconds = b.forward_seconds;
  }

  // [Gemma 2 block price] Every gemma2 layer runs its attention as eager tiles ([Soft-capped
  // attention tiles], common/softcap_attention.h): beside the incoming gradients and the output's,
  // a tile's scores (SoftcapAttentionMemory) instead of flash attention's workspace. Time: the two
  // products per score at the GEMM rate over every key a tile reads (masked ones too), and the
  // elementwise passes over the scores (scale, cap, mask, fp32 softmax and its casts: about
  // 12 d + 8 bytes a score) at the memory rate; backward recomputes the tile and runs twice its
  // products and passes. Not yet checked against a GPU run.
  for (int64_t l = 0; l < arch.num_layers && arch.IsGemma(); ++l) {
    const int64_t window = arch.LayerWindow(l);
    const SoftcapAttentionBytes tiles =
        SoftcapAttentionMemory(arch, window, workload.micro_batch, seq, d);
    BlockTrace& b = trace.blocks[static_cast<size_t>(l)];
    const int64_t beside = tokens * (2 * d * h + d * hq) + dequant_transient;
    b.forward_transient_bytes =
        std::max(b.forward_transient_bytes, beside + tiles.forward_transient);
    b.backward_transient_bytes =
        std::max(b.backward_transient_bytes, beside + tiles.backward_transient);
    const int64_t rows = SoftcapTileRows(workload.micro_batch, arch.num_heads, seq, window);
    double scores = 0;
    for (int64_t q0 = 0; q0 < seq; q0 += rows) {
      const int64_t r = std::min(rows, seq - q0);
      const int64_t k0 = window > 0 ? std::max<int64_t>(0, q0 - window + 1) : 0;
      scores += static_cast<double>(r) * static_cast<double>(q0 + r - k0);
    }
    scores *= static_cast<double>(workload.micro_batch * arch.num_heads);
    const double gemm_flops = 4.0 * static_cast<double>(hd) * scores;
    const double passes = scores * static_cast<double>(12 * d + 8);
    b.forward_seconds += gemm_flops / lin_rate - attn_flops / attn_rate + passes / hbm_rate;
    b.backward_seconds +=
        3.0 * gemm_flops / lin_rate - 2.5 * attn_flops / attn_rate + 3.0 * passes / hbm_rate;
    b.recompute_seconds = b.forward_seconds;
  }

  // [Block time] The host's floor under every block (a sparse one included).
  const double p = options.host_overlap_exponent;
  const auto with_floor = [p](double device, double floor) {
    if (floor <= 0) return device;
    if (p == 0) return std::max(device, floor);
    return std::pow(std::pow(device, p) + std::pow(floor, p), 1.0 / p);
  };
  for (BlockTrace& b : trace.blocks) {
    b.forward_seconds = with_floor(b.forward_seconds, options.block_forward_floor_seconds);
    b.backward_seconds = with_floor(b.backward_seconds, options.block_backward_floor_seconds);
    b.recompute_seconds = b.forward_seconds;
  }

  // Embedding (and a vision tower): EmbeddingMemory.
  const EmbeddingBytes embedding = EmbeddingMemory(arch, workload, param_dtype, full);
  trace.embedding.param_bytes = embed_params * d;
  trace.embedding.saved_bytes = embedding.saved;
  trace.embedding.forward_transient_bytes = embedding.forward_transient;
  trace.embedding.backward_transient_bytes = embedding.backward_transient;
  trace.embedding.forward_seconds = 2.0 * t * static_cast<double>(h * d) / hbm_rate;
  trace.embedding.backward_seconds =
      full ? (2.0 * t * static_cast<double>(h * (d + 4)) + static_cast<double>(embed_params * d)) /
                 hbm_rate
           : 0.0;
  int64_t vision_params = 0;
  if (arch.IsVisionLanguage()) {
    // [Vision tower price] Its weights are packed with the embedding ([Parameter order]); its
    // bytes are in EmbeddingMemory; its time at the matmul and memory rates like the blocks'.
    const VisionTowerCost tower = VisionTowerCostFor(
        arch, workload.micro_batch * workload.images_per_sample, workload.image_height,
        workload.image_width, param_dtype, full, workload.vision_checkpoint);
    vision_params = tower.param_count;
    trace.embedding.param_bytes += tower.param_bytes;
    trace.embedding.forward_seconds +=
        tower.forward_flops / matmul_rate + tower.forward_traffic_bytes / hbm_rate;
    trace.embedding.backward_seconds +=
        tower.backward_flops / matmul_rate + tower.backward_traffic_bytes / hbm_rate;
  }

  // Head: final norm, LM head, cross-entropy (HeadMemory, HeadTime), at the default head chunk
  // (RepriceHeadChunks prices another).
  const bool chunked_head = options.chunked_head && HeadIsChunked(tokens, vocab, h);
  const HeadBytes head = HeadMemory(arch, param_dtype, full, tokens, chunked_head);
  trace.head.param_bytes = head_params * d;
  trace.head.saved_bytes = head.saved;
  trace.head.forward_transient_bytes = head.forward_transient;
  trace.head.backward_transient_bytes = head.backward_transient;
  const HeadSeconds head_time = HeadTime(arch, param_dtype, full, tokens, chunked_head,
                                         kHeadChunkLogitBytes, matmul_rate, hbm_rate);
  trace.head.forward_seconds = head_time.forward;
  trace.head.backward_seconds = head_time.backward;

  int64_t layer_params = 0;
  double forward_end = static_cast<double>(trace.embedding.saved_bytes) +
                       static_cast<double>(trace.head.saved_bytes);
  for (int64_t l = 0; l < arch.num_layers; ++l) {
    layer_params += arch.IsMoeLayer(l) ? sparse_block_params : block_params;
    forward_end += static_cast<double>(trace.blocks[static_cast<size_t>(l)].saved_bytes);
  }
  trace.total_param_count = embed_params + vision_params + head_params + layer_params;
  trace.trainable_param_count = full ? trace.total_param_count : arch.num_layers * adapter_params;
  if (osft) {
    ASSIGN_OR_RETURN(
        const OsftCost cost,
        EstimateOsftCost(arch, OsftWorkloadFor(training, param_dtype, OptimizerKind::kAdamW, 1)));
    trace.trainable_param_count = cost.trainable_params;
  }
  // Saturating: absurd (but valid) sizes are rejected by the planner, not overflowed here.
  trace.forward_end_bytes = static_cast<int64_t>(std::min(forward_end, 1152921504606846976.0));
  return trace;
}

Trace ScaleTraceToWorkload(const Trace& trace, const Workload& workload) {
  const double from = static_cast<double>(trace.workload.micro_batch * trace.workload.seq_len);
  const double to = static_cast<double>(workload.micro_batch * workload.seq_len);
  const double f = from > 0 ? to / from : 1.0;
  Trace out = trace;
  out.workload = workload;
  // QLoRA's dequantization transient is one weight copy whatever the tokens: it does not scale.
  const int64_t fixed_transient =
      trace.training.kind == TrainingKind::kQlora && ValidateModelSpec(trace.arch, "").ok()
          ? QloraDequantTransient(trace.arch, DTypeBytes(trace.param_dtype)).bytes
          : 0;
  auto scale_transient = [&](int64_t bytes) {
    const int64_t fixed = std::min(bytes, fixed_transient);
    return Scale(bytes - fixed, f) + fixed;
  };
  // [Sparse layer price] Nor do a sparse layer's stacked expert weights.
  const bool valid_arch = ValidateModelSpec(trace.arch, "").ok();
  for (size_t l = 0; l < out.blocks.size(); ++l) {
    BlockTrace& b = out.blocks[l];
    const int64_t stacked = valid_arch && trace.arch.IsMoeLayer(static_cast<int64_t>(l))
                                ? SparseLayerStackedBytes(trace.arch, DTypeBytes(trace.param_dtype))
                                : 0;
    auto scale_block_transient = [&](int64_t bytes) {
      const int64_t fixed = std::min(bytes, stacked);
      return scale_transient(bytes - fixed) + fixed;
    };
    b.input_bytes = Scale(b.input_bytes, f);
    b.saved_bytes = Scale(b.saved_bytes, f);
    b.forward_transient_bytes = scale_block_transient(b.forward_transient_bytes);
    b.backward_transient_bytes = scale_block_transient(b.backward_transient_bytes);
    b.forward_seconds *= f;
    b.backward_seconds *= f;
    b.recompute_seconds *= f;
  }
  for (EdgeTrace* e : {&out.embedding, &out.head}) {
    e->saved_bytes = Scale(e->saved_bytes, f);
    e->forward_transient_bytes = Scale(e->forward_transient_bytes, f);
    e->backward_transient_bytes = Scale(e->backward_transient_bytes, f);
    e->forward_seconds *= f;
    e->backward_seconds *= f;
  }
  out.forward_end_bytes = Scale(out.forward_end_bytes, f);
  if (ValidateModelSpec(trace.arch, "").ok() && from > 0) {
    // The head's memory is not linear in the tokens once one side runs the chunked head
    // (common/head_chunking.h): keep what the trace holds beyond the formula at its own
    // workload, and add the formula at the new one.
    const bool full = trace.training.kind == TrainingKind::kFull;
    auto head_at = [&](const Workload& w) {
      const int64_t tokens = w.micro_batch * w.seq_len;
      return HeadMemory(trace.arch, trace.param_dtype, full, tokens,
                        HeadIsChunked(tokens, trace.arch.vocab_size, trace.arch.hidden_size));
    };
    const HeadBytes was = head_at(trace.workload);
    const HeadBytes now = head_at(workload);
    auto rebase = [](int64_t measured, int64_t formula_was, int64_t formula_now) {
      return std::max<int64_t>(0, measured - formula_was + formula_now);
    };
    const int64_t scaled_saved = out.head.saved_bytes;
    out.head.saved_bytes = rebase(trace.head.saved_bytes, was.saved, now.saved);
    out.head.forward_transient_bytes =
        rebase(trace.head.forward_transient_bytes, was.forward_transient, now.forward_transient);
    out.head.backward_transient_bytes =
        rebase(trace.head.backward_transient_bytes, was.backward_transient, now.backward_transient);
    out.forward_end_bytes += out.head.saved_bytes - scaled_saved;

    // [Vision tower price] A vision tower's bytes follow the images (micro_batch x
    // images_per_sample), not the tokens: the embedding group is rebased the same way.
    if (trace.arch.IsVisionLanguage() && trace.workload.images_per_sample > 0 &&
        workload.images_per_sample > 0 && ValidateWorkload(workload, "").ok()) {
      const EmbeddingBytes emb_was =
          EmbeddingMemory(trace.arch, trace.workload, trace.param_dtype, full);
      const EmbeddingBytes emb_now = EmbeddingMemory(trace.arch, workload, trace.param_dtype, full);
      const int64_t scaled_emb_saved = out.embedding.saved_bytes;
      out.embedding.saved_bytes = rebase(trace.embedding.saved_bytes, emb_was.saved, emb_now.saved);
      out.embedding.forward_transient_bytes =
          rebase(trace.embedding.forward_transient_bytes, emb_was.forward_transient,
                 emb_now.forward_transient);
      out.embedding.backward_transient_bytes =
          rebase(trace.embedding.backward_transient_bytes, emb_was.backward_transient,
                 emb_now.backward_transient);
      out.forward_end_bytes += out.embedding.saved_bytes - scaled_emb_saved;
    }

    // [Sequence-tiled MLP] A block keeps its MLP's intermediates only where the MLP runs whole:
    // crossing the tiling threshold moves them in or out of every block's saved bytes (the
    // transients keep their scaled, larger, figures).
    const int64_t d = DTypeBytes(trace.param_dtype);
    const int64_t inter = trace.arch.intermediate_size;
    auto tiled_at = [&](const Workload& w) {
      return MlpIsTiled(w.micro_batch * w.seq_len, inter, d);
    };
    const bool tiled_was = tiled_at(trace.workload), tiled_now = tiled_at(workload);
    if (tiled_was != tiled_now) {
      const LoraTargets lora = full ? LoraTargets{} : TargetsOf(trace.training);
      auto saved_tok = [&](bool tiled) {
        return MlpSavedPerToken(d, trace.arch.hidden_size, inter, full || lora.gate || lora.up,
                                full || lora.down, tiled);
      };
      const int64_t tokens = workload.micro_batch * workload.seq_len;
      const int64_t delta = tokens * (saved_tok(tiled_now) - saved_tok(tiled_was));
      for (size_t l = 0; l < out.blocks.size(); ++l) {
        // A mixture of experts' sparse layers never tile (the agent tiles the dense MLP only).
        if (trace.arch.IsMoeLayer(static_cast<int64_t>(l))) continue;
        BlockTrace& b = out.blocks[l];
        const int64_t before = b.saved_bytes;
        b.saved_bytes = std::max<int64_t>(0, b.saved_bytes + delta);
        out.forward_end_bytes += b.saved_bytes - before;
      }
    }
  }
  return out;
}

Trace RepriceHeadChunks(const Trace& trace, const HardwareSpec& hardware, int64_t from_logit_bytes,
                        int64_t to_logit_bytes, const AnalyticTraceOptions& options) {
  const int64_t from = HeadChunkLogitBytes(from_logit_bytes);
  const int64_t to = HeadChunkLogitBytes(to_logit_bytes);
  if (from == to || !options.chunked_head || !ValidateModelSpec(trace.arch, "").ok()) return trace;
  const int64_t tokens = trace.workload.micro_batch * trace.workload.seq_len;
  const int64_t vocab = trace.arch.vocab_size, h = trace.arch.hidden_size;
  const bool full = trace.training.kind == TrainingKind::kFull;
  const bool chunked_was = HeadIsChunked(tokens, vocab, h, from);
  const bool chunked_now = HeadIsChunked(tokens, vocab, h, to);
  // As ScaleTraceToWorkload: keep what the trace holds beyond the formula, add the new formula.
  const HeadBytes was = HeadMemory(trace.arch, trace.param_dtype, full, tokens, chunked_was, from);
  const HeadBytes now = HeadMemory(trace.arch, trace.param_dtype, full, tokens, chunked_now, to);
  auto rebase = [](int64_t measured, int64_t formula_was, int64_t formula_now) {
    return std::max<int64_t>(0, measured - formula_was + formula_now);
  };
  Trace out = trace;
  out.head.saved_bytes = rebase(trace.head.saved_bytes, was.saved, now.saved);
  out.head.forward_transient_bytes =
      rebase(trace.head.forward_transient_bytes, was.forward_transient, now.forward_transient);
  out.head.backward_transient_bytes =
      rebase(trace.head.backward_transient_bytes, was.backward_transient, now.backward_transient);
  out.forward_end_bytes += out.head.saved_bytes - trace.head.saved_bytes;
  const double matmul_rate = MatmulRate(hardware, trace.param_dtype) * options.matmul_efficiency;
  const double hbm_rate = hardware.hbm_bytes_per_second * options.hbm_efficiency;
  if (matmul_rate > 0 && hbm_rate > 0) {
    const HeadSeconds t_was = HeadTime(trace.arch, trace.param_dtype, full, tokens, chunked_was,
                                       from, matmul_rate, hbm_rate);
    const HeadSeconds t_now = HeadTime(trace.arch, trace.param_dtype, full, tokens, chunked_now, to,
                                       matmul_rate, hbm_rate);
    out.head.forward_seconds =
        std::max(0.0, trace.head.forward_seconds - t_was.forward + t_now.forward);
    out.head.backward_seconds =
        std::max(0.0, trace.head.backward_seconds - t_was.backward + t_now.backward);
  }
  return out;
}

}  // namespace memplan
