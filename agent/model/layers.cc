#include "agent/model/layers.h"

#include <optional>
#include <string>
#include <vector>

#if defined(MEMPLAN_GATED_CUDA) || defined(MEMPLAN_RMS_NORM_CUDA)
#include <c10/cuda/CUDAGuard.h>

#include "agent/core/kernel_launch.h"
#endif
#ifdef MEMPLAN_GATED_CUDA
#include "agent/model/gated_kernel.h"
#endif
#ifdef MEMPLAN_RMS_NORM_CUDA
#include "agent/model/rms_norm_kernel.h"
#endif

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
    SaveForBackward(ctx, {w.requires_grad() ? x : torch::Tensor()}, {w});
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
    const variable_list saved = SavedForBackward(ctx);
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

// [Fused norm] Hugging Face's RMSNorm as one autograd Function that keeps the input and the fp32
// rstd for backward, where the eager graph keeps an fp32 copy of the input, the normalised value
// cast back and the rstd. Forward is the eager ops themselves; backward the eager graph's backward
// ops, recomputing the normalised value from the input. PyTorch's _fused_rms_norm kernels round
// once where eager rounds twice: on the GPU that moved three of the bf16 parity suite's 23
// checkpoints past its bound (a MoE routing decision flipped in one), so the norm keeps the eager
// roundings. Values and gradients are the eager graph's bit for bit (agent_fused_ops_test). The
// weight is saved as the parameter itself (see LinearFunction).
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
#ifdef MEMPLAN_RMS_NORM_CUDA
    if (UseKernel(x, weight)) {
      // The squares and the output in one pass each (rms_norm_kernel.h); the mean and rsqrt are
      // the ops below on the same fp32 squares.
      const c10::cuda::CUDAGuard guard(x.device());
      const auto dtype = *cuda::KernelDtypeOf(x);
      void* stream = cuda::CurrentStream(x);
      torch::Tensor sq = torch::empty(x.sizes(), x.options().dtype(torch::kFloat32));
      cuda::CheckLaunch(model_cuda::LaunchRmsNormSquares(x.data_ptr(), x.numel(), dtype,
                                                         sq.data_ptr<float>(), stream),
                        "RMSNorm");
      const torch::Tensor rstd = torch::rsqrt(sq.mean(-1, /*keepdim=*/true) + eps);
      sq = torch::Tensor();
      torch::Tensor y = torch::empty_like(x);
      const int64_t width = x.size(-1);
      cuda::CheckLaunch(
          model_cuda::LaunchRmsNormForward(x.data_ptr(), weight.data_ptr(), rstd.data_ptr<float>(),
                                           x.numel() / width, width, dtype, y.data_ptr(), stream),
          "RMSNorm");
      SaveForBackward(ctx, {x, rstd}, {weight});
      return y;
    }
#endif
    const torch::Tensor x32 = x.to(torch::kFloat32);
    const torch::Tensor rstd = torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
    SaveForBackward(ctx, {x, rstd}, {weight});
    return weight * (x32 * rstd).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = SavedForBackward(ctx);
    const torch::Tensor& x = saved[0];
    const torch::Tensor& rstd = saved[1];
    const torch::Tensor& w = saved[2];
    // The eager graph's backward op for op, each rounding where autograd's rounds (so the
    // gradients are its own bit for bit): y = w * cast(n), n = x32 * r,
    // r = rsqrt(mean(x32²) + eps).
    const torch::Tensor& g = grads[0];
    torch::Tensor gx, gw;
#ifdef MEMPLAN_RMS_NORM_CUDA
    if (UseKernel(x, w) && g.is_contiguous() && g.scalar_type() == x.scalar_type() &&
        g.sizes() == x.sizes()) {
      // The same ops with their element-wise passes fused (rms_norm_kernel.h); the row sums are
      // ATen's on the same tensors.
      const c10::cuda::CUDAGuard guard(x.device());
      const auto dtype = *cuda::KernelDtypeOf(x);
      void* stream = cuda::CurrentStream(x);
      const int64_t width = x.size(-1);
      const int64_t rows = x.numel() / width;
      if (ctx->needs_input_grad(1)) {
        torch::Tensor gwp = torch::empty_like(x);
        cuda::CheckLaunch(model_cuda::LaunchRmsNormWeightGradProduct(
                              g.data_ptr(), x.data_ptr(), rstd.data_ptr<float>(), rows, width,
                              dtype, gwp.data_ptr(), stream),
                          "RMSNorm backward");
        gw = gwp.sum(RowDims(g)).to(w.scalar_type());
      }
      if (ctx->needs_input_grad(0)) {
        torch::Tensor prod = torch::empty(x.sizes(), x.options().dtype(torch::kFloat32));
        cuda::CheckLaunch(
            model_cuda::LaunchRmsNormGradProduct(g.data_ptr(), w.data_ptr(), x.data_ptr(), rows,
                                                 width, dtype, prod.data_ptr<float>(), stream),
            "RMSNorm backward");
        const torch::Tensor gr = prod.sum(-1, /*keepdim=*/true);
        prod = torch::Tensor();
        const torch::Tensor gsq = SquaresGrad(gr, rstd, width).contiguous();
        gx = torch::empty_like(x);
        cuda::CheckLaunch(model_cuda::LaunchRmsNormGradInput(
                              g.data_ptr(), w.data_ptr(), x.data_ptr(), rstd.data_ptr<float>(),
                              gsq.data_ptr<float>(), rows, width, dtype, gx.data_ptr(), stream),
                          "RMSNorm backward");
      }
      return {gx, gw, torch::Tensor()};
    }
#endif
    const torch::Tensor x32 = x.to(torch::kFloat32);
    if (ctx->needs_input_grad(1)) {
      // w's gradient: g * cast(n), summed over the broadcast rows.
      gw = (g * (x32 * rstd).to(x.scalar_type())).sum(RowDims(g)).to(w.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      const torch::Tensor gn = (g * w).to(torch::kFloat32);           // through the cast
      const torch::Tensor gr = (gn * x32).sum(-1, /*keepdim=*/true);  // n's factor r
      const torch::Tensor gsq = SquaresGrad(gr, rstd, x.size(-1));
      gx = (gn * rstd + gsq * (2.0 * x32)).to(x.scalar_type());  // n's and pow's paths
    }
    return {gx, gw, torch::Tensor()};
  }

 private:
  // The gradient of each row's mean of squares from gr, the row sum that multiplies rstd: rsqrt's
  // backward, then mean's; the eager graph's ops, shared by both paths of backward.
  static torch::Tensor SquaresGrad(const torch::Tensor& gr, const torch::Tensor& rstd,
                                   int64_t width) {
    const torch::Tensor gvar = -0.5 * gr * rstd.pow(3);  // rsqrt's backward
    return gvar / width;                                 // mean's backward
  }
  // Every dimension but the last: the rows a weight's gradient is summed over.
  static std::vector<int64_t> RowDims(const torch::Tensor& t) {
    std::vector<int64_t> rows(static_cast<size_t>(t.dim() - 1));
    for (int64_t d = 0; d < t.dim() - 1; ++d) rows[static_cast<size_t>(d)] = d;
    return rows;
  }
#ifdef MEMPLAN_RMS_NORM_CUDA
  // A contiguous 16-bit CUDA input with a contiguous weight of its dtype over its last dimension.
  static bool UseKernel(const torch::Tensor& x, const torch::Tensor& w) {
    const auto dtype = cuda::KernelDtypeOf(x);
    return dtype.has_value() && *dtype != cuda::KernelDtype::kFloat32 && x.is_contiguous() &&
           x.dim() >= 1 && x.numel() > 0 && w.defined() && w.device() == x.device() &&
           w.scalar_type() == x.scalar_type() && w.is_contiguous() && w.dim() == 1 &&
           w.size(0) == x.size(-1);
  }
#endif
};

// [Fused gate] silu(g) * u (gelu_tanh(g) * u for Gemma's GeGLU) as one autograd Function that
// keeps g and u, where the eager graph keeps the activation's output as well; backward recomputes
// it. SiLU on CUDA runs gated_kernel.cu (one pass each way, the eager ops' roundings); elsewhere
// the eager ops themselves.
class GatedProductFunction : public torch::autograd::Function<GatedProductFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g, const torch::Tensor& u,
                               bool gelu_tanh) {
    ctx->save_for_backward({g, u});
    ctx->saved_data["gelu_tanh"] = gelu_tanh;
#ifdef MEMPLAN_GATED_CUDA
    if (!gelu_tanh && SameLayout(g, u)) {
      const c10::cuda::CUDAGuard guard(g.device());
      const torch::Tensor gc = g.contiguous();
      const torch::Tensor uc = u.contiguous();
      torch::Tensor out = torch::empty_like(gc);
      cuda::CheckLaunch(model_cuda::LaunchSiluGateForward(
                            gc.data_ptr(), uc.data_ptr(), out.data_ptr(), gc.numel(),
                            *cuda::KernelDtypeOf(g), cuda::CurrentStream(g)),
                        "fused SwiGLU");
      return out;
    }
#endif
    return Activate(g, gelu_tanh) * u;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& g = saved[0];
    const torch::Tensor& u = saved[1];
    const bool gelu_tanh = ctx->saved_data["gelu_tanh"].toBool();
    const torch::Tensor& dy = grads[0];
#ifdef MEMPLAN_GATED_CUDA
    if (!gelu_tanh && SameLayout(g, u) && SameLayout(g, dy)) {
      const c10::cuda::CUDAGuard guard(g.device());
      const torch::Tensor gc = g.contiguous();
      const torch::Tensor uc = u.contiguous();
      const torch::Tensor dc = dy.contiguous();
      torch::Tensor dg = torch::empty_like(gc);
      torch::Tensor du = torch::empty_like(gc);
      cuda::CheckLaunch(
          model_cuda::LaunchSiluGateBackward(dc.data_ptr(), gc.data_ptr(), uc.data_ptr(),
                                             dg.data_ptr(), du.data_ptr(), gc.numel(),
                                             *cuda::KernelDtypeOf(g), cuda::CurrentStream(g)),
          "fused SwiGLU");
      return {dg, du, torch::Tensor()};
    }
#endif
    // The eager ops' backward: mul's two products, then the activation's own backward.
    torch::Tensor du = dy * Activate(g, gelu_tanh);
    const torch::Tensor da = dy * u;
    torch::Tensor dg = gelu_tanh ? at::gelu_backward(da, g, "tanh") : at::silu_backward(da, g);
    return {dg, du, torch::Tensor()};
  }

 private:
  static torch::Tensor Activate(const torch::Tensor& g, bool gelu_tanh) {
    return gelu_tanh ? at::gelu(g, "tanh") : at::silu(g);
  }
#ifdef MEMPLAN_GATED_CUDA
  static bool SameLayout(const torch::Tensor& a, const torch::Tensor& b) {
    return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
           a.device() == b.device() && cuda::KernelDtypeOf(a).has_value();
  }
#endif
};

// weight * n for a weight that needs no gradient, as eager's mul (same values, and the same
// gradient of n: grad * weight), keeping the weight beyond swap's hooks ([Frozen weights stay on
// the device]): the fp32 and the vision tower's RMSNorm of a frozen base.
class FrozenScaleFunction : public torch::autograd::Function<FrozenScaleFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight,
                               const torch::Tensor& n) {
    SaveForBackward(ctx, {}, {weight});
    return weight * n;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {torch::Tensor(), grads[0] * SavedForBackward(ctx)[0]};
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

namespace {
std::string FrozenKey(size_t i) { return "frozen_weight_" + std::to_string(i); }
}  // namespace

void SaveForBackward(torch::autograd::AutogradContext* ctx, std::vector<torch::Tensor> activations,
                     const std::vector<torch::Tensor>& weights) {
  for (const torch::Tensor& w : weights) {
    if (w.defined() && !w.requires_grad()) {
      ctx->saved_data[FrozenKey(activations.size())] = w;
      activations.emplace_back();
    } else {
      activations.push_back(w);
    }
  }
  ctx->save_for_backward(activations);
}

torch::autograd::variable_list SavedForBackward(torch::autograd::AutogradContext* ctx) {
  variable_list saved = ctx->get_saved_variables();
  for (size_t i = 0; i < saved.size(); ++i) {
    if (auto it = ctx->saved_data.find(FrozenKey(i)); it != ctx->saved_data.end()) {
      saved[i] = it->second.toTensor();
    }
  }
  return saved;
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!b.defined()) return LinearFunction::apply(x, w, std::nullopt);
  return LinearFunction::apply(x, w, std::optional<torch::Tensor>(b));
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // An fp32 input is its own fp32 view, so eager autograd sums the norm's two gradient paths into
  // the input's gradient one by one beside the residual's; the Function sums them first, which
  // rounds otherwise. fp32 keeps the eager graph (and its saved tensors: NormSavedBytes).
  if (x.scalar_type() == torch::kFloat32) return RmsNormUnfused(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

torch::Tensor RmsNormUnfused(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat32);
  const torch::Tensor variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  const torch::Tensor normed = x32 * torch::rsqrt(variance + eps);
  if (weight.requires_grad()) return weight * normed.to(x.scalar_type());
  return FrozenScaleFunction::apply(weight, normed.to(x.scalar_type()));
}

torch::Tensor GatedProduct(const torch::Tensor& g, const torch::Tensor& u, GateActivation act) {
  return GatedProductFunction::apply(g, u, act == GateActivation::kGeluTanh);
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

torch::Tensor SwapHalves(const torch::Tensor& x) {
  return x.unflatten(-1, {2, x.size(-1) / 2}).flip(-2).flatten(-2);
}

}  // namespace memplan
