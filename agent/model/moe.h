// The sparse (mixture-of-experts) MLP of Qwen3-MoE and Mixtral layers: a router, top-k routing and
// per-expert SwiGLU, plus the load-balancing loss Hugging Face adds in training. LlamaModel calls
// it from its Block for the layers ModelSpec::IsMoeLayer names.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/core/param_residency.h"
#include "agent/core/torch_pch.h"
#include "common/types.h"

namespace memplan {

// One sparse layer's parameters, in [Parameter order] (common/param_shapes.h): the router
// [num_experts, hidden], then per expert gate [moe_intermediate, hidden], up (same shape) and
// down [hidden, moe_intermediate], under their checkpoint names. Not thread-safe.
struct MoeParams {
  // Names and shapes for layer `layer` of `spec`; the tensors are left undefined for the model's
  // initialisation to fill (their addresses stay put: the vector is never resized).
  static MoeParams Shaped(const ModelSpec& spec, int64_t layer);

  const torch::Tensor& router() const { return tensors[0]; }
  // which: 0 gate, 1 up, 2 down.
  const torch::Tensor& expert(int64_t e, int which) const {
    return tensors[static_cast<size_t>(1 + 3 * e + which)];
  }
  std::vector<NamedParam> Named() const;

  int64_t layer = 0;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<torch::Tensor> tensors;
};

// [Router load balance] The auxiliary loss of one Loss() call, as transformers'
// load_balancing_loss_func computes it over every sparse layer of the forward:
//   aux = E * sum_e (C_e / R) * (P_e / R),
// C_e the top-k assignments to expert e and P_e the sum of its softmax probabilities, both summed
// over all tokens of all sparse layers, R the number of (layer, token) rows. C is a count, without
// gradient, so d aux / d p[l, t, e] = E * C_e / R^2 for every layer l: the gradient of layer l's
// router logits needs the counts of every layer, known only once the forward is complete. Each
// layer therefore records its counts and probability sums (Record), AddTo adds coef * aux to the
// LM loss as a constant and learns the loss's upstream gradient in backward, and a hook on each
// layer's router logits adds that layer's share of the gradient when backward reaches it. The same
// code serves the plain and the grouped loss (each block in its own autograd Function, recomputed
// under CKPT/HS_OFFLOAD: a recompute records the same values again), so both give identical
// results. Not thread-safe; one object per Loss() call, kept alive by the hooks until backward.
class MoeRouterLoss {
 public:
  explicit MoeRouterLoss(const ModelSpec& spec);

  // Layer `layer`'s router logits [tokens, E] (model dtype, the tensor the routing reads), its
  // fp32 softmax and the top-k assignments per expert [E] (any numeric dtype, on the device: read
  // without a host synchronisation).
  void Record(int64_t layer, const torch::Tensor& logits, const torch::Tensor& probs,
              const torch::Tensor& expert_counts);
  // lm_loss + router_aux_loss_coef * aux over the layers recorded so far.
  torch::Tensor AddTo(const torch::Tensor& lm_loss);
  // The aux value of the last AddTo (fp32 scalar), for tests and reports.
  torch::Tensor last_aux() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// How MoeMlp runs the experts' projections ([Grouped experts] in moe.cc). Both compute the same
// products, equal to within the GEMM kernels' rounding (an ulp now and then on the CPU).
enum class MoeExperts {
  // One grouped GEMM (at::_grouped_mm) per projection over every expert, no host synchronisation,
  // wherever MoeGroupedGemmRuns holds; the loop elsewhere.
  kGrouped,
  // A GEMM per expert and projection, sliced by row counts read on the host (one synchronisation
  // per layer on CUDA); the reference and the fallback.
  kLoop,
};

// Whether the grouped path runs for `spec`'s experts on tensors of `dtype` on `device`: fp32,
// bf16 or fp16 with 16-byte rows (hidden and expert width), fewer than 1 024 experts, and on CUDA
// bf16 on compute capability 9.x or 10.x only (where ATen has grouped kernels; elsewhere its
// _grouped_mm loops over the experts and reads their offsets on the host for every call).
bool MoeGroupedGemmRuns(const ModelSpec& spec, torch::ScalarType dtype,
                        const torch::Device& device);

// The sparse MLP on `y` [batch, seq, hidden] (the post-attention norm's output): router logits,
// softmax in fp32, top-k, renormalised when spec.norm_topk_prob, each expert's SwiGLU on the
// tokens routed to it scaled by their routing weight, summed per token. Qwen3-MoE casts the
// weights to the model dtype before scaling, Mixtral scales in fp32 and casts the product, as
// transformers does. Deterministic on every device: tokens are grouped by a stable sort and put
// back by a permutation, never summed with atomics. `router_loss` (may be null) records the
// layer's statistics. `experts` picks the experts' path (kGrouped falls back to the loop where
// MoeGroupedGemmRuns does not hold).
torch::Tensor MoeMlp(const ModelSpec& spec, const MoeParams& p, const torch::Tensor& y,
                     MoeRouterLoss* router_loss, MoeExperts experts = MoeExperts::kGrouped);

}  // namespace memplan
