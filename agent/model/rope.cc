#include "agent/model/rope.h"

#include <vector>

#include "agent/model/layers.h"

#ifdef MEMPLAN_ROPE_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "agent/core/kernel_launch.h"
#include "agent/model/rope_kernel.h"
#endif

namespace memplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// cos or sin as [table_batch, seq, head_dim], from any of the shapes ApplyRope takes.
torch::Tensor TableBsd(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() >= 2 && t.dim() <= 4, "ApplyRope: ", name,
              " must be [seq, head_dim], [table_batch, seq, head_dim] or "
              "[table_batch, 1, seq, head_dim], got ",
              t.sizes());
  if (t.dim() == 2) return t.unsqueeze(0);
  if (t.dim() == 4) {
    TORCH_CHECK(t.size(1) == 1, "ApplyRope: a 4-dimensional ", name,
                " table must be [table_batch, 1, seq, head_dim], got ", t.sizes());
    return t.squeeze(1);
  }
  return t;
}

// [Fused RoPE] out = x * cos + SwapHalves(x) * sin, linear in x, so backward needs only the
// tables: grad_x = grad * cos + SwapHalves(grad * sin). Eager autograd keeps the same two tables
// (mul keeps the other factor; x itself is never kept, as cos and sin need no grad).
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  // cos and sin [table_batch, seq, head_dim] contiguous, checked by ApplyRope.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    SaveForBackward(ctx, {}, {cos, sin});
#ifdef MEMPLAN_ROPE_CUDA
    if (UseKernel(x)) return RunKernel(x, cos, sin, /*backward=*/false);
#endif
    // The decoder's expression, with the tables broadcast over heads.
    return x * cos.unsqueeze(2) + SwapHalves(x) * sin.unsqueeze(2);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = SavedForBackward(ctx);
    const torch::Tensor& cos = saved[0];
    const torch::Tensor& sin = saved[1];
    const torch::Tensor& g = grads[0];
#ifdef MEMPLAN_ROPE_CUDA
    if (UseKernel(g)) return {RunKernel(g, cos, sin, /*backward=*/true), {}, {}};
#endif
    // Eager autograd's order: mul's backward for each product, flip's for the swapped one, then
    // the sum of x's two gradients.
    return {g * cos.unsqueeze(2) + SwapHalves(g * sin.unsqueeze(2)), {}, {}};
  }

 private:
#ifdef MEMPLAN_ROPE_CUDA
  static bool UseKernel(const torch::Tensor& t) { return cuda::KernelDtypeOf(t).has_value(); }

  static torch::Tensor RunKernel(const torch::Tensor& in, const torch::Tensor& cos,
                                 const torch::Tensor& sin, bool backward) {
    const c10::cuda::CUDAGuard guard(in.device());
    // The gradient arrives in whatever layout the op after the caller's transpose produced.
    const torch::Tensor ic = in.contiguous();
    torch::Tensor out = torch::empty_like(ic, at::MemoryFormat::Contiguous);
    model_cuda::RopeShape shape;
    shape.batch = ic.size(0);
    shape.seq = ic.size(1);
    shape.heads = ic.size(2);
    shape.head_dim = ic.size(3);
    shape.table_batch = cos.size(0);
    const cuda::KernelDtype dtype = *cuda::KernelDtypeOf(ic);
    void* stream = cuda::CurrentStream(ic);
    const int err =
        backward ? model_cuda::LaunchRopeBackward(ic.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                                  out.data_ptr(), shape, dtype, stream)
                 : model_cuda::LaunchRopeForward(ic.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                                 out.data_ptr(), shape, dtype, stream);
    cuda::CheckLaunch(err, "fused RoPE");
    return out;
  }
#endif
};

}  // namespace

torch::Tensor ApplyRope(const torch::Tensor& x_bshd, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  TORCH_CHECK(x_bshd.defined() && cos.defined() && sin.defined(),
              "ApplyRope: x, cos and sin must be defined");
  TORCH_CHECK(x_bshd.dim() == 4, "ApplyRope: x must be [batch, seq, heads, head_dim], got ",
              x_bshd.sizes());
  const int64_t batch = x_bshd.size(0);
  const int64_t seq = x_bshd.size(1);
  const int64_t head_dim = x_bshd.size(3);
  TORCH_CHECK(head_dim % 2 == 0, "ApplyRope: head_dim must be even, got ", head_dim);
  TORCH_CHECK(cos.sizes() == sin.sizes(), "ApplyRope: cos ", cos.sizes(), " and sin ", sin.sizes(),
              " differ in shape");
  TORCH_CHECK(
      cos.scalar_type() == x_bshd.scalar_type() && sin.scalar_type() == x_bshd.scalar_type(),
      "ApplyRope: cos (", cos.scalar_type(), ") and sin (", sin.scalar_type(),
      ") must have x's dtype (", x_bshd.scalar_type(), ")");
  TORCH_CHECK(cos.device() == x_bshd.device() && sin.device() == x_bshd.device(),
              "ApplyRope: cos (", cos.device(), ") and sin (", sin.device(),
              ") must be on x's device (", x_bshd.device(), ")");
  TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(),
              "ApplyRope: cos and sin must not require grad (backward gives them none)");
  const torch::Tensor c = TableBsd(cos, "cos").contiguous();
  const torch::Tensor s = TableBsd(sin, "sin").contiguous();
  const int64_t table_batch = c.size(0);
  TORCH_CHECK(table_batch == 1 || table_batch == batch, "ApplyRope: the tables' batch (",
              table_batch, ") must be 1 or x's batch (", batch, ")");
  TORCH_CHECK(c.size(1) == seq && c.size(2) == head_dim, "ApplyRope: the tables' [seq, head_dim] (",
              c.size(1), ", ", c.size(2), ") must be x's (", seq, ", ", head_dim, ")");
  return RopeFunction::apply(x_bshd.contiguous(), c, s);
}

}  // namespace memplan
