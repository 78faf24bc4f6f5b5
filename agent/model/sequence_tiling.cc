#include "agent/model/sequence_tiling.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "agent/blocks/rng_fork.h"

namespace memplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct TiledCall : torch::CustomClassHolder {
  RowFunction fn;
  int64_t tile_rows = 0;
  bool input_requires_grad = false;
  RngState rng;
};

// fn over the rows of `rows2d` ([T, H]), tile by tile, into one [T, H_out] tensor.
torch::Tensor RunTiles(const RowFunction& fn, const torch::Tensor& rows2d, int64_t tile_rows) {
  const int64_t total = rows2d.size(0);
  torch::Tensor out;
  for (int64_t begin = 0; begin < total; begin += tile_rows) {
    const int64_t end = std::min(total, begin + tile_rows);
    torch::Tensor tile = fn(rows2d.slice(0, begin, end));
    if (!out.defined()) out = at::empty({total, tile.size(-1)}, tile.options());
    out.slice(0, begin, end).copy_(tile);
  }
  return out;
}

class SequenceTiledFunction : public torch::autograd::Function<SequenceTiledFunction> {
 public:
  // `anchor` requires grad when `rows2d` does not, so that the node is recorded for the
  // parameters fn uses (a frozen base's first block under LoRA gets an input without gradient).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows2d,
                               const torch::Tensor& anchor, c10::intrusive_ptr<TiledCall> call) {
    (void)anchor;
    call->input_requires_grad = rows2d.requires_grad();
    call->rng = CaptureRng(rows2d.device());
    torch::Tensor out = RunTiles(call->fn, rows2d, call->tile_rows);
    ctx->save_for_backward({rows2d});
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<TiledCall>(ctx->saved_data["call"].toCapsule());
    ctx->saved_data.erase("call");
    torch::Tensor rows2d = ctx->get_saved_variables()[0];
    const torch::Tensor& grad_out = grad_outputs[0];
    torch::Tensor grad_in;
    if (call->input_requires_grad) grad_in = at::zeros_like(rows2d);
    if (grad_out.defined()) {
      RngFork fork(call->rng);
      torch::AutoGradMode grad_on(true);
      const int64_t total = rows2d.size(0);
      for (int64_t begin = 0; begin < total; begin += call->tile_rows) {
        const int64_t end = std::min(total, begin + call->tile_rows);
        torch::Tensor leaf = rows2d.slice(0, begin, end).detach();
        if (call->input_requires_grad) leaf.requires_grad_(true);
        torch::Tensor tile = call->fn(leaf);
        if (tile.requires_grad()) {
          torch::autograd::backward({tile}, {grad_out.slice(0, begin, end)});
        }
        tile.reset();
        if (call->input_requires_grad && leaf.grad().defined()) {
          grad_in.slice(0, begin, end).copy_(leaf.grad());
        }
      }
    }
    return {grad_in, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor SequenceTiled(const RowFunction& fn, const torch::Tensor& x, int64_t tile_rows) {
  TORCH_CHECK(tile_rows > 0, "SequenceTiled: tile_rows must be positive, got ", tile_rows);
  std::vector<int64_t> out_sizes = x.sizes().vec();
  const torch::Tensor rows2d = x.reshape({-1, x.size(-1)});
  torch::Tensor out;
  if (!torch::GradMode::is_enabled()) {
    // Nothing to differentiate (a no-grad forward, e.g. before a CKPT group's recompute).
    out = RunTiles(fn, rows2d, tile_rows);
  } else {
    auto call = c10::make_intrusive<TiledCall>();
    call->fn = fn;
    call->tile_rows = tile_rows;
    torch::Tensor anchor = torch::empty(
        {0}, torch::TensorOptions().device(x.device()).requires_grad(!x.requires_grad()));
    out = SequenceTiledFunction::apply(rows2d, anchor, std::move(call));
  }
  out_sizes.back() = out.size(-1);
  return out.view(out_sizes);
}

}  // namespace memplan
