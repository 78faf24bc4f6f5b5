#include "agent/model/moe.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "agent/model/layers.h"
#include "common/param_shapes.h"

namespace memplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x·wᵀ for a 2-D x of any row count, zero included. Like the model's LinearFunction it saves
// the weight itself (a chunk manager may swap the parameter's storage before backward) and keeps
// x only when the weight trains ([Frozen linear], agent/model/layers.cc: a LoRA run's router and
// experts, which take no adapters, keep nothing of their own); unlike it, an expert that
// receives no token still gets a weight gradient (zeros), as the fused expert tensor of
// transformers does, so its optimizer step (weight decay) matches.
class ExpertLinearFunction : public torch::autograd::Function<ExpertLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w) {
    SaveForBackward(ctx, {w.requires_grad() ? x : torch::Tensor()}, {w});
    return at::mm(x, w.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = SavedForBackward(ctx);
    const torch::Tensor& g = grads[0];
    torch::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) gx = g.mm(saved[1]);
    if (ctx->needs_input_grad(1)) gw = g.t().mm(saved[0]);
    return {gx, gw};
  }
};

torch::Tensor ExpertLinear(const torch::Tensor& x, const torch::Tensor& w) {
  return ExpertLinearFunction::apply(x, w);
}

// [Grouped experts] The rows of x [R, in] sorted by expert, expert e's rows ending at ends[e]
// (int32, on the device), each multiplied by its expert's weight: y = x_e · w_eᵀ in one
// at::_grouped_mm, so no row count reaches the host. The weights are separate parameters (their
// chunks place them), so each call stacks them into one [E, out, in] tensor for the product and
// drops it; the Function saves the parameters themselves, as ExpertLinearFunction does, and
// stacks them again in backward rather than keep E·out·in elements per projection alive; it keeps
// x only when some expert's weight trains ([Frozen linear]). Backward:
// dx = _grouped_mm(dy, W) and dW = _grouped_mm(dyᵀ, x), the latter [E, out, in] with zeros for an
// expert without rows (ATen's CUDA kernel accepts empty groups in this layout only: dyᵀ column-
// major, x row-major), split into the experts' gradients as views.
class GroupedExpertLinearFunction : public torch::autograd::Function<GroupedExpertLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& ends, at::TensorList w) {
    const bool weights_train =
        std::any_of(w.begin(), w.end(), [](const torch::Tensor& t) { return t.requires_grad(); });
    SaveForBackward(ctx, {weights_train ? x : torch::Tensor(), ends}, w.vec());
    return at::_grouped_mm(x, at::stack(w).transpose(1, 2), ends);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = SavedForBackward(ctx);
    const torch::Tensor& x = saved[0];
    const torch::Tensor& ends = saved[1];
    const at::TensorList w(saved.data() + 2, saved.size() - 2);
    const torch::Tensor g = grads[0].contiguous();
    variable_list out(saved.size());
    if (ctx->needs_input_grad(0)) out[0] = at::_grouped_mm(g, at::stack(w), ends);
    bool weights = false;
    for (size_t e = 0; e < w.size(); ++e) weights = weights || ctx->needs_input_grad(2 + e);
    if (weights) {
      const torch::Tensor gw = at::_grouped_mm(g.t(), x, ends);
      for (size_t e = 0; e < w.size(); ++e) {
        if (ctx->needs_input_grad(2 + e)) out[2 + e] = gw[static_cast<int64_t>(e)];
      }
    }
    return out;
  }
};

// Projection `which` (0 gate, 1 up, 2 down) of every expert on the sorted rows.
torch::Tensor GroupedExpertLinear(const torch::Tensor& x, const torch::Tensor& ends,
                                  const MoeParams& p, int which) {
  const int64_t experts = static_cast<int64_t>(p.tensors.size() - 1) / 3;
  std::vector<torch::Tensor> w;
  w.reserve(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) w.push_back(p.expert(e, which));
  return GroupedExpertLinearFunction::apply(x, ends, at::TensorList(w));
}

// The loop: each expert's rows sliced by counts read on the host, three ExpertLinears each.
torch::Tensor LoopExperts(const torch::Tensor& sorted, const torch::Tensor& counts,
                          const MoeParams& p) {
  const int64_t num_experts = counts.size(0);
  const torch::Tensor host = counts.to(torch::kCPU, torch::kLong);
  const int64_t* count = host.data_ptr<int64_t>();
  // One split (its backward is one concatenation), not a narrow per expert: each narrow's
  // backward would fill a zero gradient of all T·k rows and add it in, E times per layer.
  const std::vector<torch::Tensor> expert_rows =
      sorted.split_with_sizes(c10::IntArrayRef(count, static_cast<size_t>(num_experts)), 0);
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(num_experts));
  for (int64_t e = 0; e < num_experts; ++e) {
    // Every expert runs, empty ones on zero rows, so every expert weight gets a gradient.
    const torch::Tensor& in = expert_rows[static_cast<size_t>(e)];
    const torch::Tensor gate = ExpertLinear(in, p.expert(e, 0));
    const torch::Tensor up = ExpertLinear(in, p.expert(e, 1));
    outs.push_back(ExpertLinear(GatedProduct(gate, up), p.expert(e, 2)));
  }
  return torch::cat(outs, 0);
}

int CudaComputeMajor(const torch::Device& device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index()) !=
      cudaSuccess) {
    return 0;
  }
  return major;
}

}  // namespace

bool MoeGroupedGemmRuns(const ModelSpec& spec, torch::ScalarType dtype,
                        const torch::Device& device) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kHalf) return false;
  // Every operand's row stride is hidden or the expert width (16-byte multiples, ATen's check).
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  if ((spec.hidden_size * bytes) % 16 != 0 || (spec.moe_intermediate_size * bytes) % 16 != 0) {
    return false;
  }
  if (spec.num_experts >= 1024) return false;  // the CUDA kernel's limit on groups
  if (device.is_cpu()) return true;            // ATen's CPU kernel: one mm per group, same values
  if (!device.is_cuda() || dtype != torch::kBFloat16) return false;
  const int major = CudaComputeMajor(device);
  return major == 9 || major == 10;
}

MoeParams MoeParams::Shaped(const ModelSpec& spec, int64_t layer) {
  MoeParams p;
  p.layer = layer;
  const int64_t h = spec.hidden_size;
  const int64_t f = spec.moe_intermediate_size;
  p.names.push_back(MoeRouterName(spec, layer));
  p.shapes.push_back({spec.num_experts, h});
  for (int64_t e = 0; e < spec.num_experts; ++e) {
    p.names.push_back(MoeExpertName(spec, layer, e, MoeProjection::kGate));
    p.shapes.push_back({f, h});
    p.names.push_back(MoeExpertName(spec, layer, e, MoeProjection::kUp));
    p.shapes.push_back({f, h});
    p.names.push_back(MoeExpertName(spec, layer, e, MoeProjection::kDown));
    p.shapes.push_back({h, f});
  }
  p.tensors.resize(p.names.size());
  return p;
}

std::vector<NamedParam> MoeParams::Named() const {
  std::vector<NamedParam> out;
  out.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    if (tensors[i].defined()) out.push_back({names[i], tensors[i]});
  }
  return out;
}

struct MoeRouterLoss::State {
  int64_t num_experts = 0;
  double coef = 0;
  struct Layer {
    torch::Tensor counts;     // [E] fp32, top-k assignments per expert
    torch::Tensor prob_sums;  // [E] fp32
    int64_t rows = 0;
  };
  std::map<int64_t, Layer> layers;  // by layer index: a recompute overwrites its own entry
  // Set by AddTo: the summed counts and rows the gradient uses; set in backward: the gradient of
  // whatever the caller differentiates with respect to the returned loss.
  torch::Tensor total_counts;
  double total_rows = 0;
  torch::Tensor grad_scale;
  torch::Tensor aux;
};

MoeRouterLoss::MoeRouterLoss(const ModelSpec& spec) : state_(std::make_shared<State>()) {
  state_->num_experts = spec.num_experts;
  state_->coef = spec.router_aux_loss_coef;
}

void MoeRouterLoss::Record(int64_t layer, const torch::Tensor& logits, const torch::Tensor& probs,
                           const torch::Tensor& expert_counts) {
  TORCH_CHECK(expert_counts.dim() == 1 && expert_counts.size(0) == state_->num_experts,
              "router load-balancing loss: one count per expert expected");
  State::Layer& l = state_->layers[layer];
  {
    torch::NoGradGuard no_grad;
    l.counts = expert_counts.to(torch::kFloat32);
    l.prob_sums = probs.detach().sum(0);
    l.rows = probs.size(0);
  }
  if (!logits.requires_grad()) return;
  // The layer's share of d(coef * aux)/d logits, through the softmax: for each token,
  // p ⊙ (c - p·c) with c = coef * g * E * C / R^2, added to what the routing itself sends back.
  const torch::Tensor p = probs.detach();
  std::shared_ptr<State> state = state_;
  logits.register_hook([state, p](const torch::Tensor& grad) -> torch::Tensor {
    TORCH_CHECK(state->total_counts.defined() && state->grad_scale.defined(),
                "router load-balancing loss: backward reached a router before the loss's own "
                "backward (was the loss from MoeRouterLoss::AddTo differentiated?)");
    const double r = state->total_rows;
    const torch::Tensor c = state->total_counts * (state->grad_scale.to(torch::kFloat32) *
                                                   (state->coef * state->num_experts / (r * r)));
    const torch::Tensor pc = (p * c).sum(-1, /*keepdim=*/true);
    return grad + (p * (c - pc)).to(grad.scalar_type());
  });
}

torch::Tensor MoeRouterLoss::AddTo(const torch::Tensor& lm_loss) {
  State& s = *state_;
  TORCH_CHECK(!s.layers.empty(), "router load-balancing loss: no sparse layer was recorded");
  {
    torch::NoGradGuard no_grad;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(lm_loss.device());
    // Summed layer by layer in fp32 from zero, in layer order, as transformers does.
    torch::Tensor counts = torch::zeros({s.num_experts}, f32);
    torch::Tensor probs = torch::zeros({s.num_experts}, f32);
    double rows = 0;
    for (const auto& [index, layer] : s.layers) {
      counts = counts + layer.counts;
      probs = probs + layer.prob_sums;
      rows += static_cast<double>(layer.rows);
    }
    s.total_counts = counts;
    s.total_rows = rows;
    s.aux = (counts / rows * (probs / rows)).sum() * static_cast<double>(s.num_experts);
    s.grad_scale = torch::Tensor();
  }
  torch::Tensor total = lm_loss + s.aux.to(lm_loss.scalar_type()) * s.coef;
  if (total.requires_grad()) {
    std::shared_ptr<State> state = state_;
    total.register_hook([state](const torch::Tensor& grad) { state->grad_scale = grad.detach(); });
  }
  return total;
}

torch::Tensor MoeRouterLoss::last_aux() const { return state_->aux; }

torch::Tensor MoeMlp(const ModelSpec& spec, const MoeParams& p, const torch::Tensor& y,
                     MoeRouterLoss* router_loss, MoeExperts experts) {
  const int64_t h = y.size(-1);
  const int64_t k = spec.num_experts_per_tok;
  const int64_t num_experts = spec.num_experts;
  const torch::Tensor x = y.reshape({-1, h});
  const int64_t tokens = x.size(0);

  const torch::Tensor logits = ExpertLinear(x, p.router());
  const torch::Tensor probs = at::softmax(logits.to(torch::kFloat32), -1);
  auto [top_w, top_i] = probs.topk(k, -1);
  if (spec.norm_topk_prob) top_w = top_w / top_w.sum(-1, /*keepdim=*/true);
  // Qwen3-MoE rounds the routing weights to the model dtype; Mixtral keeps them in fp32.
  if (spec.family != "mixtral") top_w = top_w.to(logits.scalar_type());

  // The (token, slot) rows grouped by expert with a stable sort, so each expert reads one
  // contiguous slice; expert e's slice ends where the sorted ids pass e (a search on the device,
  // int32 as _grouped_mm takes its offsets), and the counts follow without a host read.
  const torch::Tensor flat_expert = top_i.reshape({-1});
  const auto [sorted_expert, order] = flat_expert.sort(/*stable=*/true, 0, false);
  const torch::Tensor ends =
      at::searchsorted(sorted_expert, at::arange(num_experts, sorted_expert.options()),
                       /*out_int32=*/true, /*right=*/true);
  const torch::Tensor counts = at::diff(ends, 1, 0, ends.new_zeros({1}));
  if (router_loss != nullptr) router_loss->Record(p.layer, logits, probs, counts);

  // Each token repeated k times (its gradient sums back over the k copies in a fixed order), then
  // permuted: no index is read twice, so no backward accumulates through atomics.
  const torch::Tensor rows = x.unsqueeze(1).expand({tokens, k, h}).reshape({tokens * k, h});
  const torch::Tensor sorted = rows.index_select(0, order);
  torch::Tensor expert_out;
  if (experts == MoeExperts::kGrouped && MoeGroupedGemmRuns(spec, x.scalar_type(), x.device())) {
    // Every expert is in each product, empty ones included, so every expert weight gets a
    // gradient (zeros for an expert without rows), as in the loop.
    const torch::Tensor gate = GroupedExpertLinear(sorted, ends, p, 0);
    const torch::Tensor up = GroupedExpertLinear(sorted, ends, p, 1);
    expert_out = GroupedExpertLinear(GatedProduct(gate, up), ends, p, 2);
  } else {
    expert_out = LoopExperts(sorted, counts, p);
  }
  const torch::Tensor weights = top_w.reshape({-1}).index_select(0, order).unsqueeze(1);
  const torch::Tensor weighted = (expert_out * weights).to(y.scalar_type());
  const torch::Tensor inverse =
      at::empty_like(order).scatter_(0, order, at::arange(tokens * k, order.options()));
  // Back in (token, slot) order; the k contributions of a token summed in slot order.
  const torch::Tensor per_slot = weighted.index_select(0, inverse).view({tokens, k, h});
  return per_slot.sum(1).view(y.sizes());
}

}  // namespace memplan
