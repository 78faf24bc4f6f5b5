#include "agent/model/softcap_attention.h"

#include <algorithm>
#include <limits>

#include "common/softcap_attention.h"

namespace memplan {
namespace {

// Additive mask of `rows` queries (the first at position q0) over `keys` keys (the first at k0):
// 0 where the query sees the key, -inf elsewhere. transformers adds the dtype's minimum instead;
// either way the key's probability is exactly 0.
torch::Tensor TileMask(int64_t q0, int64_t rows, int64_t k0, int64_t keys, int64_t window,
                       const torch::TensorOptions& options) {
  const auto i64 = options.dtype(torch::kLong);
  // Distance key - query of every pair.
  const torch::Tensor rel = torch::arange(k0, k0 + keys, i64).unsqueeze(0) -
                            torch::arange(q0, q0 + rows, i64).unsqueeze(1);
  torch::Tensor visible = rel <= 0;
  if (window > 0) visible = visible.logical_and(rel > -window);
  return torch::zeros({rows, keys}, options)
      .masked_fill_(visible.logical_not(), -std::numeric_limits<double>::infinity());
}

// One tile, differentiable: queries q [B, H, R, D] over keys k and values v [B, Hkv, K, D].
// The order of operations is eager_attention_forward's (Gemma2): product, scale, cap, mask,
// fp32 softmax cast back, product with v.
torch::Tensor TileAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& mask, double scale, double softcap) {
  const int64_t b = q.size(0), heads = q.size(1), rows = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2);
  const int64_t groups = heads / kv_heads;
  // Query head h reads kv head h / groups (repeat_kv's order): the groups of one kv head are
  // stacked along the rows.
  const torch::Tensor qg = q.reshape({b, kv_heads, groups * rows, dim});
  torch::Tensor s = at::matmul(qg, k.transpose(-1, -2)) * scale;
  if (softcap > 0) s = torch::tanh(s / softcap) * softcap;
  s = s.view({b, kv_heads, groups, rows, keys}) + mask;
  const torch::Tensor p = at::softmax(s, -1, torch::kFloat32).to(q.scalar_type());
  return at::matmul(p.view({b, kv_heads, groups * rows, keys}), v).view({b, heads, rows, dim});
}

// Calls fn(first_query, rows, first_key, keys) for every tile, in order; tiles of `forced_rows`
// queries when > 0, else SoftcapTileRows().
template <typename Fn>
void ForEachTile(int64_t batch, int64_t heads, int64_t seq, int64_t window, int64_t forced_rows,
                 Fn fn) {
  const int64_t tile_rows =
      forced_rows > 0 ? forced_rows : SoftcapTileRows(batch, heads, seq, window);
  for (int64_t t = 0; t < seq; t += tile_rows) {
    const int64_t rows = std::min(tile_rows, seq - t);
    const int64_t k0 = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
    fn(t, rows, k0, t + rows - k0);
  }
}

class SoftcapAttentionFunction : public torch::autograd::Function<SoftcapAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, int64_t window,
                               double scale, double softcap, int64_t tile_rows) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["window"] = window;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["tile_rows"] = tile_rows;
    // [batch, seq, heads, head_dim] storage, the layout the output projection reads as is.
    torch::Tensor out =
        torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
    ForEachTile(q.size(0), q.size(1), q.size(2), window, tile_rows,
                [&](int64_t t, int64_t rows, int64_t k0, int64_t keys) {
                  const torch::Tensor mask = TileMask(t, rows, k0, keys, window, q.options());
                  out.narrow(2, t, rows)
                      .copy_(TileAttention(q.narrow(2, t, rows), k.narrow(2, k0, keys),
                                           v.narrow(2, k0, keys), mask, scale, softcap));
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
    const double scale = ctx->saved_data["scale"].toDouble();
    const double softcap = ctx->saved_data["softcap"].toDouble();
    const int64_t tile_rows = ctx->saved_data["tile_rows"].toInt();
    const torch::Tensor& grad_out = grads[0];
    // A key's gradient collects every tile that reads it: summed in fp32 for 16-bit models.
    const auto sum_dtype = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    torch::Tensor dq = torch::empty_like(q);
    torch::Tensor dk = torch::zeros(k.sizes(), k.options().dtype(sum_dtype));
    torch::Tensor dv = torch::zeros(v.sizes(), v.options().dtype(sum_dtype));
    torch::AutoGradMode grad_mode(true);
    ForEachTile(q.size(0), q.size(1), q.size(2), window, tile_rows,
                [&](int64_t t, int64_t rows, int64_t k0, int64_t keys) {
                  const torch::Tensor mask = TileMask(t, rows, k0, keys, window, q.options());
                  torch::Tensor qt = q.narrow(2, t, rows).detach().requires_grad_(true);
                  torch::Tensor kt = k.narrow(2, k0, keys).detach().requires_grad_(true);
                  torch::Tensor vt = v.narrow(2, k0, keys).detach().requires_grad_(true);
                  const torch::Tensor out = TileAttention(qt, kt, vt, mask, scale, softcap);
                  const torch::autograd::variable_list g =
                      torch::autograd::grad({out}, {qt, kt, vt}, {grad_out.narrow(2, t, rows)});
                  dq.narrow(2, t, rows).copy_(g[0]);
                  dk.narrow(2, k0, keys).add_(g[1]);
                  dv.narrow(2, k0, keys).add_(g[2]);
                });
    return {dq,
            dk.to(k.scalar_type()),
            dv.to(v.scalar_type()),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor SoftcapAttention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t window, double scale, double softcap,
                               int64_t tile_rows) {
  return SoftcapAttentionFunction::apply(q, k, v, window, scale, softcap, tile_rows);
}

}  // namespace memplan
