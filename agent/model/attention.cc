#include "agent/model/attention.h"

#include <algorithm>
#include <limits>

#include "common/sliding_window.h"

namespace memplan {
namespace {

// Additive mask of `rows` queries over `keys` keys, the first query `offset` positions after the
// first key: 0 where the query sees the key (0 <= offset + row - key < window), -inf elsewhere.
// Rows are allocated padded (SlidingWindowMaskRowElems) so that SDPA's memory-efficient kernel
// takes the mask without copying it.
torch::Tensor BandMask(int64_t rows, int64_t keys, int64_t offset, int64_t window,
                       const torch::TensorOptions& options) {
  const int64_t cols = SlidingWindowMaskRowElems(keys);
  const double inf = std::numeric_limits<double>::infinity();
  // Future keys: key - row > offset.
  torch::Tensor mask = torch::full({rows, cols}, -inf, options).triu_(offset + 1);
  // Keys that left the window: key - row <= offset - window; only when some row reaches one.
  if (offset - window > -rows) {
    mask.add_(torch::full({rows, cols}, -inf, options).tril_(offset - window));
  }
  return mask.narrow(1, 0, keys);
}

// One tile: queries q over keys k and values v under `mask`; the kv heads repeated per query
// head (the memory-efficient kernel that takes a mask has no grouped-query mode).
torch::Tensor TileAttention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v,
                            const torch::Tensor& mask) {
  const int64_t groups = q.size(1) / k.size(1);
  if (groups > 1) {
    k = k.repeat_interleave(groups, /*dim=*/1);
    v = v.repeat_interleave(groups, /*dim=*/1);
  }
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false);
}

// Calls fn(first_query, rows, first_key, keys, mask) for every tile of a sequence of `seq`
// tokens, in order ([Sliding-window tiles]). Tiles that start at least window - 1 positions in
// share one mask (a full tile's, cut to the last tile's rows); earlier ones, whose keys start at
// position 0, have their own.
template <typename Fn>
void ForEachTile(int64_t seq, int64_t window, const torch::TensorOptions& options, Fn fn) {
  const int64_t tile_rows = SlidingWindowTileRows(window);
  torch::Tensor interior;
  for (int64_t t = 0; t < seq; t += tile_rows) {
    const int64_t rows = std::min(tile_rows, seq - t);
    const int64_t k0 = std::max<int64_t>(0, t - window + 1);
    const int64_t keys = t + rows - k0;
    torch::Tensor mask;
    if (t >= window - 1) {
      if (!interior.defined()) {
        interior = BandMask(tile_rows, window + tile_rows - 1, window - 1, window, options);
      }
      mask = interior.narrow(0, 0, rows).narrow(1, 0, keys);
    } else {
      mask = BandMask(rows, keys, t - k0, window, options);
    }
    fn(t, rows, k0, keys, mask);
  }
}

class SlidingWindowAttention : public torch::autograd::Function<SlidingWindowAttention> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, int64_t window) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["window"] = window;
    // [batch, seq, heads, head_dim] storage, the layout the output projection reads as is.
    torch::Tensor out =
        torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
    ForEachTile(q.size(2), window, q.options(),
                [&](int64_t t, int64_t rows, int64_t k0, int64_t keys, const torch::Tensor& mask) {
                  out.narrow(2, t, rows)
                      .copy_(TileAttention(q.narrow(2, t, rows), k.narrow(2, k0, keys),
                                           v.narrow(2, k0, keys), mask));
                });
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& q = saved[0];
    const torch::Tensor& k = saved[1];
    const torch::Tensor& v = saved[2];
    const int64_t window = ctx->saved_data["window"].toInt();
    const torch::Tensor& grad_out = grads[0];
    // A key's gradient collects up to window / tile_rows + 1 tiles: summed in fp32 for 16-bit
    // models so it is rounded once.
    const auto sum_dtype = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    torch::Tensor dq = torch::empty_like(q);
    torch::Tensor dk = torch::zeros(k.sizes(), k.options().dtype(sum_dtype));
    torch::Tensor dv = torch::zeros(v.sizes(), v.options().dtype(sum_dtype));
    torch::AutoGradMode grad_mode(true);
    ForEachTile(q.size(2), window, q.options(),
                [&](int64_t t, int64_t rows, int64_t k0, int64_t keys, const torch::Tensor& mask) {
                  torch::Tensor qt = q.narrow(2, t, rows).detach().requires_grad_(true);
                  torch::Tensor kt = k.narrow(2, k0, keys).detach().requires_grad_(true);
                  torch::Tensor vt = v.narrow(2, k0, keys).detach().requires_grad_(true);
                  const torch::Tensor out = TileAttention(qt, kt, vt, mask);
                  const torch::autograd::variable_list g =
                      torch::autograd::grad({out}, {qt, kt, vt}, {grad_out.narrow(2, t, rows)});
                  dq.narrow(2, t, rows).copy_(g[0]);
                  dk.narrow(2, k0, keys).add_(g[1]);
                  dv.narrow(2, k0, keys).add_(g[2]);
                });
    return {dq, dk.to(k.scalar_type()), dv.to(v.scalar_type()), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              int64_t window) {
  if (!SlidingWindowTiled(window, q.size(2))) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, /*scale=*/std::nullopt,
                                            /*enable_gqa=*/k.size(1) != q.size(1));
  }
  return SlidingWindowAttention::apply(q, k, v, window);
}

}  // namespace memplan
