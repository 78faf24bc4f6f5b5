#include "agent/model/layers.h"

#include <optional>
#include <vector>

namespace memplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x·wᵀ + b as an autograd Function that saves the weight itself rather than the view w.t()
// that aten::linear saves. A saved view pins the storage the weight had in forward; parameters
// whose storage a chunk manager swaps (ParamResidency) must be read through the parameter, which
// then holds whatever storage PreBackward gave it.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  // `b` is optional because custom Functions require every Tensor argument to be defined.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const std::optional<torch::Tensor>& b) {
    // [Frozen linear] The input is kept only when the weight's gradient needs it: a frozen
    // projection (a LoRA base module without an adapter) keeps nothing of its own, as
    // aten::linear keeps nothing for a weight that does not require grad, and as the planner
    // prices it (planner/cost/analytic_trace.cc: a linear keeps its input only when it trains).
    ctx->save_for_backward({w.requires_grad() ? x : torch::Tensor(), w});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["has_bias"] = b.has_value();
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
    const torch::Tensor w2 = w.view({w.size(0), -1});
    const torch::Tensor y2 = b.has_value() ? at::addmm(*b, x2, w2.t()) : at::mm(x2, w2.t());
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return y2.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const std::vector<int64_t> x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const torch::Tensor w2 = w.view({w.size(0), -1});
    const torch::Tensor g2 = grads[0].reshape({-1, w.size(0)});
    torch::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = g2.mm(w2).view(x_sizes);
    if (ctx->needs_input_grad(1)) gw = g2.t().mm(x.reshape({-1, x.size(-1)})).view(w.sizes());
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) gb = g2.sum(0);
    return {gx, gw, gb};
  }
};

}  // namespace

torch::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return torch::kFloat32;
    case DType::kBFloat16:
      return torch::kBFloat16;
    case DType::kFloat16:
      return torch::kFloat16;
  }
  return torch::kFloat32;
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!b.defined()) return LinearFunction::apply(x, w, std::nullopt);
  return LinearFunction::apply(x, w, std::optional<torch::Tensor>(b));
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat32);
  const torch::Tensor variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  const torch::Tensor normed = x32 * torch::rsqrt(variance + eps);
  return weight * normed.to(x.scalar_type());
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

torch::Tensor SwapHalves(const torch::Tensor& x) {
  return x.unflatten(-1, {2, x.size(-1) / 2}).flip(-2).flatten(-2);
}

}  // namespace memplan
