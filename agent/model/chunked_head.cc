#include "agent/model/chunked_head.h"

#include <algorithm>

namespace memplan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [Chunked head] (common/head_chunking.h): the LM head and cross-entropy over `rows` tokens at a
// time. Forward computes the mean loss and, while each chunk's logits exist, the gradients of the
// loss with respect to the head's input and weight (softmax minus one-hot, divided by the count of
// non-ignored targets, cast to the model dtype as autograd does through logits.float()); backward
// only scales them by the upstream gradient. The logits of the whole sequence never exist, and
// the weight is not read in backward (a chunk manager may have moved it by then).
class ChunkedHeadLossFunction : public torch::autograd::Function<ChunkedHeadLossFunction> {
 public:
  // softcap > 0: the logits are capped as tanh(z / softcap) * softcap in the model dtype (Gemma
  // 2's final_logit_softcapping), their gradient times the cap's derivative 1 - tanh².
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& targets, int64_t rows, double softcap) {
    const bool want_gx = x.requires_grad();
    const bool want_gw = w.requires_grad();
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
    const torch::Tensor t = targets.reshape({-1});
    const int64_t n = x2.size(0);
    const auto f32 = x2.options().dtype(torch::kFloat32);
    // 1 / (non-ignored targets), kept on the device: no synchronisation.
    const torch::Tensor inv_count = (t != -100).sum().to(torch::kFloat32).reciprocal();
    torch::Tensor loss_sum = torch::zeros({}, f32);
    torch::Tensor gx = want_gx ? torch::empty_like(x2) : torch::Tensor();
    torch::Tensor gw = want_gw ? torch::zeros(w.sizes(), f32) : torch::Tensor();
    const bool fp32_accumulate =
        x2.is_cuda() && (x2.scalar_type() == torch::kBFloat16 || x2.scalar_type() == torch::kHalf);
    for (int64_t a = 0; a < n; a += rows) {
      const int64_t b = std::min(n, a + rows);
      const torch::Tensor xc = x2.slice(0, a, b);
      const torch::Tensor tc = t.slice(0, a, b);
      torch::Tensor raw = at::mm(xc, w.t());
      torch::Tensor tanh_z;
      if (softcap > 0) {
        tanh_z = torch::tanh(raw / softcap);
        raw = tanh_z * softcap;
      }
      // fp32 log-softmax in one kernel, on logits.float() as transformers' loss takes it. The
      // model-dtype logits and then the fp32 copy are dropped as soon as they are read, so the
      // chunk holds at most 8 bytes a logit (fp32 copy and output), as ChunkedHeadMemory prices.
      // (CUDA's half_to_float path would skip the copy but takes fp16 only, not bf16.)
      torch::Tensor widened = raw.to(torch::kFloat32);
      raw = torch::Tensor();
      torch::Tensor logits = at::_log_softmax(widened, 1, /*half_to_float=*/false);
      widened = torch::Tensor();
      const torch::Tensor valid = (tc != -100).to(torch::kFloat32);
      const torch::Tensor safe = at::where(tc != -100, tc, 0).unsqueeze(1);
      loss_sum -= (logits.gather(1, safe).squeeze(1) * valid).sum();
      if (!want_gx && !want_gw) continue;
      logits.exp_();  // softmax, in place of the log-softmax
      logits.scatter_add_(1, safe, torch::full({b - a, 1}, -1.0, f32));
      const torch::Tensor scale = (valid * inv_count).unsqueeze(1);  // ignored rows: zero
      torch::Tensor grad_logits;
      if (softcap > 0 || x2.scalar_type() == torch::kFloat32) {
        logits.mul_(scale);
        if (softcap > 0) {
          const torch::Tensor t32 = tanh_z.to(torch::kFloat32);
          logits.mul_(1 - t32 * t32);
        }
        grad_logits = logits.to(x2.scalar_type());
      } else {
        // The scaling and the cast to the model dtype in one pass (the product in fp32, rounded
        // once on store: what mul_ then to() computes, without a second pass over the chunk).
        grad_logits = torch::empty(logits.sizes(), x2.options());
        at::mul_out(grad_logits, logits, scale);
      }
      logits = torch::Tensor();
      if (want_gx) {
        torch::Tensor rows_out = gx.slice(0, a, b);
        at::mm_out(rows_out, grad_logits, w);
      }
      if (want_gw) {
        if (fp32_accumulate) {
          // cuBLAS adds the bf16/fp16 product into the fp32 sum directly: no [V, H] product in
          // the model dtype, one rounding per sum as in the unchunked GEMM.
          at::addmm_out(gw, gw, grad_logits.t(), xc, torch::kFloat32);
        } else {
          gw.add_(at::mm(grad_logits.t(), xc));
        }
      }
    }
    ctx->saved_data["gx"] = want_gx ? gx.view(x.sizes()) : torch::Tensor();
    ctx->saved_data["gw"] = gw;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return loss_sum * inv_count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor& g = grads[0];
    torch::Tensor gx = ctx->saved_data["gx"].toTensor();
    torch::Tensor gw = ctx->saved_data["gw"].toTensor();
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    ctx->saved_data.clear();  // frees the saved gradients as soon as they are handed on
    // In place: an out-of-place product of the fp32 weight gradient would hold a second [V, H]
    // fp32 tensor at the head's peak (the cost model charges only the cast to the weight dtype).
    if (gx.defined()) gx.mul_(g);
    if (gw.defined()) {
      gw.mul_(g);
      gw = gw.to(w_dtype);
    }
    return {gx, gw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ChunkedHeadLoss(const torch::Tensor& x, const torch::Tensor& w,
                              const torch::Tensor& targets, int64_t rows, double softcap) {
  return ChunkedHeadLossFunction::apply(x, w, targets, rows, softcap);
}

}  // namespace memplan
