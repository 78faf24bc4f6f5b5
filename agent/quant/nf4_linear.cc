#include "agent/quant/nf4_linear.h"

#include <vector>

namespace memplan::quant {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& data, const torch::Tensor& absmax_code,
                               const torch::Tensor& absmax_scale, double absmax_offset,
                               std::vector<int64_t> shape, int64_t blocksize, bool has_bias,
                               const torch::Tensor& bias) {
    const Nf4Tensor w{data, absmax_code, absmax_scale, static_cast<float>(absmax_offset), shape,
                      blocksize};
    // The NF4 parts, not the dequantized copy, are what backward keeps.
    ctx->saved_data["data"] = data;
    ctx->saved_data["absmax_code"] = absmax_code;
    ctx->saved_data["absmax_scale"] = absmax_scale;
    ctx->saved_data["absmax_offset"] = absmax_offset;
    ctx->saved_data["shape"] = shape;
    ctx->saved_data["blocksize"] = blocksize;
    return torch::linear(x, DequantizeNf4(w, x.scalar_type()),
                         has_bias ? bias : torch::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const torch::Tensor& grad = grad_outputs[0];
    const Nf4Tensor w{ctx->saved_data["data"].toTensor(),
                      ctx->saved_data["absmax_code"].toTensor(),
                      ctx->saved_data["absmax_scale"].toTensor(),
                      static_cast<float>(ctx->saved_data["absmax_offset"].toDouble()),
                      ctx->saved_data["shape"].toIntVector(),
                      ctx->saved_data["blocksize"].toInt()};
    // dL/dx = dL/dy W: the same GEMM torch's linear backward runs, on a fresh copy of W.
    const torch::Tensor grad_x = grad.matmul(DequantizeNf4(w, grad.scalar_type()));
    variable_list grads(9);  // one per forward argument; only x takes a gradient
    grads[0] = grad_x;
    return grads;
  }
};

}  // namespace

torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Tensor& w, const torch::Tensor& bias) {
  // Function::apply cannot take an undefined tensor: no bias travels as an empty placeholder.
  const bool has_bias = bias.defined();
  return Nf4LinearFunction::apply(x, w.data, w.absmax_code, w.absmax_scale,
                                  static_cast<double>(w.absmax_offset), w.shape, w.blocksize,
                                  has_bias, has_bias ? bias : torch::empty({0}, x.options()));
}

}  // namespace memplan::quant
