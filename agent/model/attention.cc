#include "agent/model/attention.h"

#include <algorithm>
#include <limits>

#include "common/sliding_window.h"
#include "common/softcap_attention.h"

namespace memplan {
namespace {

// How a tile's queries meet their keys. kSdpa: SDPA's kernel under the tile's mask, its default
// scale and no cap ([Sliding-window tiles]). kEager: transformers' eager math with an explicit
// scale and an optional cap ([Soft-capped attention tiles]).
enum class TileKernel : int64_t { kSdpa = 0, kEager = 1 };

struct TileParams {
  TileKernel kernel = TileKernel::kSdpa;
  int64_t window = 0;     // 0: full causal attention
  int64_t tile_rows = 0;  // queries per tile, > 0
  double scale = 0.0;     // kEager only
  double softcap = 0.0;   // kEager only; 0: no cap
};

// The one mask of the tiles: `rows` queries over `keys` keys, the first query `offset` positions
// after the first key; 0 where the query sees the key (key <= query and, with a window W > 0,
// query - key < W), -inf elsewhere. transformers adds the dtype's minimum instead; either way the
// key's probability is exactly 0. Rows are allocated padded (SlidingWindowMaskRowElems) so that
// SDPA's memory-efficient kernel takes the mask without copying it.
torch::Tensor TileMask(int64_t rows, int64_t keys, int64_t offset, int64_t window,
                       const torch::TensorOptions& options) {
  const int64_t cols = SlidingWindowMaskRowElems(keys);
  const double inf = std::numeric_limits<double>::infinity();
  // Future keys: key - row > offset.
  torch::Tensor mask = torch::full({rows, cols}, -inf, options).triu_(offset + 1);
  // Keys that left the window: key - row <= offset - window; only when some row reaches one.
  if (window > 0 && offset - window > -rows) {
    mask.add_(torch::full({rows, cols}, -inf, options).tril_(offset - window));
  }
  return mask.narrow(1, 0, keys);
}

// SDPA's memory-efficient kernel, the one that takes a mask, has no grouped-query mode: the kv
// heads are repeated per query head (head h reads kv head h / groups) before the call.
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t groups) {
  return groups > 1 ? x.repeat_interleave(groups, /*dim=*/1) : x;
}

// The gradient of a repeated kv tensor back on its kv heads, the groups summed in `sum_dtype`.
torch::Tensor SumGroups(const torch::Tensor& g, int64_t groups, torch::ScalarType sum_dtype) {
  if (groups == 1) return g;
  return g.view({g.size(0), g.size(1) / groups, groups, g.size(2), g.size(3)})
      .sum(2, /*keepdim=*/false, sum_dtype);
}

torch::Tensor SdpaTile(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& mask) {
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false);
}

// Eager math on one tile: queries q [B, H, R, D] over keys k and values v [B, Hkv, K, D], in the
// order of Gemma 2's eager_attention_forward: product, scale, cap, mask, fp32 softmax cast back,
// product with v.
torch::Tensor EagerTile(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double scale, double softcap) {
  const int64_t b = q.size(0), heads = q.size(1), rows = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2);
  const int64_t groups = heads / kv_heads;
  // Query head h reads kv head h / groups (repeat_kv's order): the groups of one kv head are
  // stacked along the rows, so no key is repeated.
  const torch::Tensor qg = q.reshape({b, kv_heads, groups * rows, dim});
  torch::Tensor s = at::matmul(qg, k.transpose(-1, -2)) * scale;
  if (softcap > 0) s = torch::tanh(s / softcap) * softcap;
  s = s.view({b, kv_heads, groups, rows, keys}) + mask;
  const torch::Tensor p = at::softmax(s, -1, torch::kFloat32).to(q.scalar_type());
  return at::matmul(p.view({b, kv_heads, groups * rows, keys}), v).view({b, heads, rows, dim});
}

// One tile's output: queries q over keys k and values v (kv heads) under `mask`.
torch::Tensor RunTile(const TileParams& params, const torch::Tensor& q, const torch::Tensor& k,
                      const torch::Tensor& v, const torch::Tensor& mask) {
  if (params.kernel == TileKernel::kEager) {
    return EagerTile(q, k, v, mask, params.scale, params.softcap);
  }
  const int64_t groups = q.size(1) / k.size(1);
  return SdpaTile(q, RepeatKv(k, groups), RepeatKv(v, groups), mask);
}

// One tile recomputed under autograd: the gradients of its queries (q's dtype) and of its keys and
// values on the kv heads. For SDPA's repeated heads the groups are summed in `sum_dtype` (fp32 for
// 16-bit models): through repeat_interleave's backward they would be rounded to the dtype once
// before the sum over tiles and again after it, one rounding more than one kernel over the whole
// sequence takes.
torch::autograd::variable_list TileGrads(const TileParams& params, const torch::Tensor& q,
                                         const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& mask, const torch::Tensor& grad,
                                         torch::ScalarType sum_dtype) {
  torch::Tensor qt = q.detach().requires_grad_(true);
  if (params.kernel == TileKernel::kEager) {
    torch::Tensor kt = k.detach().requires_grad_(true);
    torch::Tensor vt = v.detach().requires_grad_(true);
    const torch::Tensor out = EagerTile(qt, kt, vt, mask, params.scale, params.softcap);
    return torch::autograd::grad({out}, {qt, kt, vt}, {grad});
  }
  const int64_t groups = q.size(1) / k.size(1);
  torch::Tensor kr = RepeatKv(k.detach(), groups).requires_grad_(true);
  torch::Tensor vr = RepeatKv(v.detach(), groups).requires_grad_(true);
  const torch::Tensor out = SdpaTile(qt, kr, vr, mask);
  torch::autograd::variable_list g = torch::autograd::grad({out}, {qt, kr, vr}, {grad});
  return {g[0], SumGroups(g[1], groups, sum_dtype), SumGroups(g[2], groups, sum_dtype)};
}

// Calls fn(first_query, rows, first_key, keys, mask) for every tile of a sequence of `seq`
// tokens, in order. Tile [t, t + R) reads the keys [k0, t + R): k0 = 0 for full attention,
// max(0, t - W + 1) within a window W. Windowed tiles that start at least W - 1 positions in share
// one mask (a full tile's, cut to the last tile's rows); the others have their own.
template <typename Fn>
void ForEachTile(int64_t seq, const TileParams& params, const torch::TensorOptions& options,
                 Fn fn) {
  const int64_t window = params.window;
  const int64_t tile_rows = params.tile_rows;
  torch::Tensor interior;
  for (int64_t t = 0; t < seq; t += tile_rows) {
    const int64_t rows = std::min(tile_rows, seq - t);
    const int64_t k0 = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
    const int64_t keys = t + rows - k0;
    torch::Tensor mask;
    if (window > 0 && t >= window - 1) {
      if (!interior.defined()) {
        interior = TileMask(tile_rows, window + tile_rows - 1, window - 1, window, options);
      }
      mask = interior.narrow(0, 0, rows).narrow(1, 0, keys);
    } else {
      mask = TileMask(rows, keys, t - k0, window, options);
    }
    fn(t, rows, k0, keys, mask);
  }
}

// Forward runs the tiles without autograd into one output and keeps q, k and v alone; backward
// recomputes each tile under autograd and adds its key and value gradients into per-layer sums.
class TiledAttentionFunction : public torch::autograd::Function<TiledAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, int64_t kernel,
                               int64_t window, int64_t tile_rows, double scale, double softcap) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["window"] = window;
    ctx->saved_data["tile_rows"] = tile_rows;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    const TileParams params{static_cast<TileKernel>(kernel), window, tile_rows, scale, softcap};
    // [batch, seq, heads, head_dim] storage, the layout the output projection reads as is.
    torch::Tensor out =
        torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
    ForEachTile(q.size(2), params, q.options(),
                [&](int64_t t, int64_t rows, int64_t k0, int64_t keys, const torch::Tensor& mask) {
                  out.narrow(2, t, rows)
                      .copy_(RunTile(params, q.narrow(2, t, rows), k.narrow(2, k0, keys),
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
    const TileParams params{static_cast<TileKernel>(ctx->saved_data["kernel"].toInt()),
                            ctx->saved_data["window"].toInt(), ctx->saved_data["tile_rows"].toInt(),
                            ctx->saved_data["scale"].toDouble(),
                            ctx->saved_data["softcap"].toDouble()};
    const torch::Tensor& grad_out = grads[0];
    // A key's gradient collects every tile that reads it: summed in fp32 for 16-bit models so it
    // is rounded once, as flash attention's is.
    const auto sum_dtype = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    torch::Tensor dq = torch::empty_like(q);
    torch::Tensor dk = torch::zeros(k.sizes(), k.options().dtype(sum_dtype));
    torch::Tensor dv = torch::zeros(v.sizes(), v.options().dtype(sum_dtype));
    torch::AutoGradMode grad_mode(true);
    ForEachTile(q.size(2), params, q.options(),
                [&](int64_t t, int64_t rows, int64_t k0, int64_t keys, const torch::Tensor& mask) {
                  const torch::autograd::variable_list g = TileGrads(
                      params, q.narrow(2, t, rows), k.narrow(2, k0, keys), v.narrow(2, k0, keys),
                      mask, grad_out.narrow(2, t, rows), sum_dtype);
                  dq.narrow(2, t, rows).copy_(g[0]);
                  dk.narrow(2, k0, keys).add_(g[1]);
                  dv.narrow(2, k0, keys).add_(g[2]);
                });
    const torch::Tensor none;
    return {dq, dk.to(k.scalar_type()), dv.to(v.scalar_type()), none, none, none, none, none};
  }
};

}  // namespace

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, int64_t window) {
  if (!SlidingWindowTiled(window, q.size(2))) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, /*scale=*/std::nullopt,
                                            /*enable_gqa=*/k.size(1) != q.size(1));
  }
  return TiledAttentionFunction::apply(q, k, v, static_cast<int64_t>(TileKernel::kSdpa), window,
                                       SlidingWindowTileRows(window), 0.0, 0.0);
}

torch::Tensor SoftcapAttention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t window, double scale, double softcap,
                               int64_t tile_rows) {
  const int64_t rows =
      tile_rows > 0 ? tile_rows : SoftcapTileRows(q.size(0), q.size(1), q.size(2), window);
  return TiledAttentionFunction::apply(q, k, v, static_cast<int64_t>(TileKernel::kEager), window,
                                       rows, scale, softcap);
}

}  // namespace memplan
