#include "agent/model/moe.h"

#include <utility>

#include "common/param_shapes.h"

namespace memplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x·wᵀ for a 2-D x of any row count, zero included. Like the model's LinearFunction it saves
// the weight itself (a chunk manager may swap the parameter's storage before backward); unlike
// it, an expert that receives no token still gets a weight gradient (zeros), as the fused expert
// tensor of transformers does, so its optimizer step (weight decay) matches.
class ExpertLinearFunction : public torch::autograd::Function<ExpertLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w) {
    ctx->save_for_backward({x, w});
    return at::mm(x, w.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
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

}  // namespace

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
                           const torch::Tensor& top_k_index) {
  const int64_t e = state_->num_experts;
  State::Layer& l = state_->layers[layer];
  {
    torch::NoGradGuard no_grad;
    l.counts = at::bincount(top_k_index.reshape({-1}), {}, e).to(torch::kFloat32);
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
                     MoeRouterLoss* router_loss) {
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
  if (router_loss != nullptr) router_loss->Record(p.layer, logits, probs, top_i);

  // The (token, slot) rows grouped by expert with a stable sort, so each expert reads one
  // contiguous slice; the per-expert row counts are needed on the host to slice.
  const torch::Tensor flat_expert = top_i.reshape({-1});
  const torch::Tensor order = std::get<1>(flat_expert.sort(/*stable=*/true, 0, false));
  const torch::Tensor counts = at::bincount(flat_expert, {}, num_experts).cpu();
  const int64_t* count = counts.data_ptr<int64_t>();
  // Each token repeated k times (its gradient sums back over the k copies in a fixed order), then
  // permuted: no index is read twice, so no backward accumulates through atomics.
  const torch::Tensor rows = x.unsqueeze(1).expand({tokens, k, h}).reshape({tokens * k, h});
  const torch::Tensor sorted = rows.index_select(0, order);
  // One split (its backward is one concatenation), not a narrow per expert: each narrow's
  // backward would fill a zero gradient of all T·k rows and add it in, E times per layer.
  const std::vector<torch::Tensor> expert_rows =
      sorted.split_with_sizes(c10::IntArrayRef(count, static_cast<size_t>(num_experts)), 0);
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(num_experts));
  for (int64_t e = 0; e < num_experts; ++e) {
    // Every expert runs, empty ones on zero rows, so every expert weight gets a gradient.
    const torch::Tensor& in = expert_rows[static_cast<size_t>(e)];
    const torch::Tensor gate = torch::silu(ExpertLinear(in, p.expert(e, 0)));
    const torch::Tensor up = ExpertLinear(in, p.expert(e, 1));
    outs.push_back(ExpertLinear(gate * up, p.expert(e, 2)));
  }
  const torch::Tensor weights = top_w.reshape({-1}).index_select(0, order).unsqueeze(1);
  const torch::Tensor weighted = (torch::cat(outs, 0) * weights).to(y.scalar_type());
  const torch::Tensor inverse = at::empty_like(order).scatter_(
      0, order, at::arange(tokens * k, order.options()));
  // Back in (token, slot) order; the k contributions of a token summed in slot order.
  const torch::Tensor per_slot = weighted.index_select(0, inverse).view({tokens, k, h});
  return per_slot.sum(1).view(y.sizes());
}

}  // namespace memplan
