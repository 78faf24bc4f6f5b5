#include "common/vision_cost.h"

#include <algorithm>
#include <initializer_list>

#include "common/param_shapes.h"
#include "common/vision_kind.h"

namespace memplan {
namespace {

constexpr double kCapBytes = 1152921504606846976.0;  // 2^60

int64_t Bytes(double v) {
  return v >= kCapBytes ? static_cast<int64_t>(kCapBytes) : static_cast<int64_t>(v);
}

double Max(std::initializer_list<double> values) { return std::max(values); }

// Σ over the windows along one side of their lengths squared, in merged patches: transformers'
// windows of `span` merged patches, the last one cut by the image's edge.
double SquaredWindowSides(int64_t merged, int64_t span) {
  const double full = static_cast<double>(merged / span);
  const double rest = static_cast<double>(merged % span);
  return full * static_cast<double>(span * span) + rest * rest;
}

}  // namespace

VisionGrid VisionGridFor(const VisionSpec& v, int64_t height, int64_t width) {
  const int64_t unit = v.patch_size * v.spatial_merge_size;
  auto side = [&](int64_t pixels) {
    return std::max<int64_t>(1, (pixels + unit - 1) / unit) * v.spatial_merge_size;
  };
  return VisionGrid{side(height), side(width)};
}

int64_t VisionTowerParamCount(const ModelSpec& model) {
  int64_t n = 0;
  for (const ParamShape& p : VisionParamShapes(model)) n += p.numel();
  return n;
}

// [Vision tower bytes] (header) in terms of agent/model/vision_tower.cc's statements.
VisionTowerCost VisionTowerCostFor(const ModelSpec& model, int64_t images, int64_t height,
                                   int64_t width, DType dtype, bool trains,
                                   bool checkpoint_blocks) {
  const VisionSpec& v = model.vision;
  const VisionGrid grid = VisionGridFor(v, height, width);
  const double hv = static_cast<double>(v.hidden_size);
  const double iv = static_cast<double>(v.intermediate_size);
  const double nh = static_cast<double>(v.num_heads);
  const double hd = static_cast<double>(v.HeadDim());
  const double p = static_cast<double>(v.PatchDim());
  const double ho = static_cast<double>(v.out_hidden_size);
  const double u = static_cast<double>(v.spatial_merge_size * v.spatial_merge_size);
  const double hm = hv * u;  // the merger's width
  const double dd = static_cast<double>(DTypeBytes(dtype));
  const bool narrow = DTypeBytes(dtype) < 4;
  const double f32_copy = narrow ? 4.0 : 0.0;  // x.to(float32) is a copy only for 16-bit x
  const double cast = narrow ? dd : 0.0;       // y.to(dtype) is a copy only for 16-bit dtypes
  // The variant (common/vision_kind.h): Qwen2-VL's LayerNorm, QuickGELU MLP, no windows.
  const bool layer_norm = VisionLayerNorm(model);
  const bool gated = VisionGatedMlp(model);
  const bool windowed = VisionWindowed(v);
  const bool ckpt = trains && checkpoint_blocks && v.depth > 0;

  VisionTowerCost c;
  c.images = images;
  c.patches = images * grid.patches();
  c.image_tokens = c.patches / (v.spatial_merge_size * v.spatial_merge_size);
  c.param_count = VisionTowerParamCount(model);
  c.param_bytes = c.param_count * DTypeBytes(dtype);
  const double n = static_cast<double>(c.patches);
  const double nm = static_cast<double>(c.image_tokens);
  const double depth = static_cast<double>(v.depth);
  c.pixel_bytes = Bytes(n * p * 4.0);
  c.output_bytes = Bytes(nm * ho * dd);

  // ---- saved for backward (per patch unless stated) ----
  // LayerNorm keeps its input, output, and fp32 mean and rstd.
  const double norm_saved = layer_norm ? 2.0 * dd * hv + 8.0 : 4.0 * hv + 2.0 * dd * hv + 4.0;
  // QuickGELU keeps fc1's output, the sigmoid and their product (SwiGLU four [N, Iv] tensors).
  const double mlp_saved = (gated ? 4.0 : 3.0) * dd * iv;
  const double block_saved = 2.0 * norm_saved + 7.0 * dd * hv + 4.0 * nh + mlp_saved;
  const double merger_saved = norm_saved + 2.0 * dd * hv;
  const double saved_tok = cast * p + 8.0 * hd + depth * block_saved + merger_saved;
  // Two int64 orders: the window order (index_select's) and its inverse (argsort's).
  const double index = windowed ? 8.0 * nm : 0.0;
  const double saved = n * saved_tok + 2.0 * index;
  // Checkpointed blocks: each keeps its input instead of its saved set.
  const double saved_ckpt =
      n * (cast * p + 8.0 * hd + depth * dd * hv + merger_saved) + 2.0 * index;
  if (trains) c.saved_bytes = Bytes(ckpt ? saved_ckpt : saved);

  // ---- transients of a frozen tower (no autograd graph): live bytes at each stage ----
  // Patch embedding: the cast pixels beside the output; the window permutation's copy.
  const double embed_stage = n * (cast * p + dd * hv);
  const double permute_stage = windowed ? n * 2.0 * dd * hv + index : 0.0;
  // Rotary tables: positions (int64 [N, 2]), angles (fp32 [N, 2, hd / 4]), cos built (fp32
  // [N, hd]) and sin being built (its cos, halves, concatenation and permuted copy, when windowed).
  // (The inverse frequencies, hd / 4 floats, are the one fixed-size tensor.)
  const double tables = 16.0 + 2.0 * hd + 8.0 * hd;  // positions, angles, cos, sin
  const double sin_build = (windowed ? 12.0 : 8.0) * hd;
  const double tables_stage = n * (dd * hv + 16.0 + 2.0 * hd + 4.0 * hd + sin_build) + index + hd;
  // Through the blocks: the residual stream and the tables.
  const double base = n * (dd * hv + tables) + index + hd;
  // RMSNorm: the fp32 input, the normalised fp32 value, its cast and the output (and rstd);
  // LayerNorm: the output, mean and rstd.
  const double norm_peak = layer_norm ? dd * hv + 8.0 : (f32_copy + 4.0 + cast + dd) * hv + 4.0;
  // Attention: the norm output, qkv, q rotated, and k's rotation (fp32 input, x·cos,
  // rotate_half(x), its product with sin, their sum, the cast); later the norm output, qkv, q, k,
  // the windows' outputs, their concatenation and the projection.
  const double attn_peak = Max({(5.0 * dd + f32_copy + 16.0 + cast) * hv, 9.0 * dd * hv});
  // SwiGLU: the norm output, SiLU(gate), up, their product and the down projection. QuickGELU:
  // the norm output, fc1's output, 1.702 times it, the sigmoid, the product and fc2's output.
  const double mlp_peak = 2.0 * dd * hv + (gated ? 3.0 : 4.0) * dd * iv;
  const double block_peak = Max({norm_peak, attn_peak, mlp_peak, 3.0 * dd * hv});
  // Merger: its norm; the first linear beside its input; GELU and the second linear beside the
  // first's output; the output and its copy back in image order, with the inverse order.
  const double merger_peak =
      Max({n * norm_peak, n * 2.0 * dd * hv, n * 2.0 * dd * hv + nm * ho * dd,
           windowed ? 2.0 * nm * ho * dd + index : 0.0});
  const double frozen_peak = Max({embed_stage, permute_stage, tables_stage,
                                  v.depth > 0 ? base + n * block_peak : 0.0, base + merger_peak});
  c.forward_transient_bytes = Bytes(frozen_peak);
  if (trains) {
    // Most of a trained tower's transients are saved: beyond its saved set it holds, at the end,
    // the merger's second output and its reordered copy beside the positions and angles (and the
    // 16-bit residual, which no norm keeps); earlier, in the last block's rotation of k, the fp32
    // input copy and three fp32 products (the sum too for 16-bit q), while the merger's share of
    // the saved set is still to come.
    // LayerNorm keeps the residual itself; without windows the output is not reordered.
    const double unsaved_stream = 16.0 + 2.0 * hd + (narrow && !layer_norm ? dd * hv : 0.0);
    const double end_stage = (windowed ? 2.0 : 1.0) * nm * ho * dd + n * unsaved_stream + hd;
    // Qwen2-VL: the rest of the last block (k, the attention output and its concatenation, the
    // log-sum-exp, the second norm and the MLP) is saved after k's rotation too. Its MLP holds
    // 1.702·fc1 and fc2's output (and, for 16-bit dtypes, the CPU matmul's fp32 accumulation,
    // 4·Hv, measured in tests/agent/model/vision_memory_test.cc) before the merger's saves.
    const double block_rest = gated ? 0.0 : 3.0 * dd * hv + 4.0 * nh + norm_saved + mlp_saved;
    const double rotation_stage =
        n * (unsaved_stream + (f32_copy + 12.0 + (narrow ? 4.0 : 0.0)) * hv - merger_saved -
             block_rest) -
        index;
    const double mlp_stage =
        gated ? 0.0
              : n * (unsaved_stream + dd * iv + dd * hv + (narrow ? 4.0 * hv : 0.0) - merger_saved);
    c.forward_transient_bytes = Bytes(Max({end_stage, rotation_stage, mlp_stage}));
    if (ckpt) {
      // Checkpointed: each block runs as the frozen tower's does, beside its input (held by the
      // checkpoint, so one residual more than the frozen block's base during its second half)
      // and the inputs already kept; the last one is the largest, before the merger's saves.
      const double ckpt_block_peak =
          Max({norm_peak + dd * hv, attn_peak, mlp_peak + dd * hv, 3.0 * dd * hv});
      const double last_block_stage =
          n * (16.0 + 2.0 * hd + ckpt_block_peak - merger_saved) + hd - index;
      c.forward_transient_bytes = Bytes(Max({end_stage, last_block_stage}));
    }
  }

  // ---- backward of a trained tower ----
  if (trains) {
    // Per patch: the residual's incoming and accumulated gradients, plus the widest of the
    // attention (the gradient of its input; q, k, v's gradients per window grown to full size and
    // summed; fp32 gradients through the rotation; qkv's gradient from each of its three parts),
    // the MLP (four [N, Iv] gradients, two input gradients) and a norm (fp32 temporaries).
    const double attn_bwd = 13.0 * dd * hv + 16.0 * hv;
    // QuickGELU: the product's, the sigmoid's, 1.702·fc1's and fc1's two gradients and their sum.
    const double mlp_bwd = (gated ? 4.0 : 5.0) * dd * iv + 2.0 * dd * hv;
    const double norm_bwd = 12.0 * hv + dd * hv;
    // The largest weight gradient before it is added into the parameter's: the merger's.
    const double weight_grad = dd * Max({hm * hm, ho * hm, 3.0 * hv * hv, iv * hv});
    // A checkpointed block's recompute adds its saved set and its output while it runs.
    const double recomputed = ckpt ? n * (block_saved + dd * hv) : 0.0;
    c.backward_transient_bytes =
        Bytes(n * (2.0 * dd * hv + Max({attn_bwd, mlp_bwd, norm_bwd})) + weight_grad + recomputed);
  }

  // ---- flops ----
  const double rows = static_cast<double>(grid.rows), cols = static_cast<double>(grid.cols);
  // Without windows every block attends over the whole image.
  const int64_t span = windowed ? v.WindowMergedPatches() : 1;
  const double full_blocks = windowed ? static_cast<double>(v.fullatt_block_indexes.size()) : depth;
  const double window_blocks = depth - full_blocks;
  // Scores and weighted values, 4·Hv per query-key pair; windows never cross images.
  const double window_pairs = u * u * SquaredWindowSides(grid.rows / v.spatial_merge_size, span) *
                              SquaredWindowSides(grid.cols / v.spatial_merge_size, span);
  const double attn_flops =
      static_cast<double>(images) * 4.0 * hv *
      (window_blocks * window_pairs + full_blocks * rows * cols * rows * cols);
  const double block_linear = 2.0 * (4.0 * hv * hv + (gated ? 3.0 : 2.0) * hv * iv);
  const double linear_flops = n * (depth * block_linear) + nm * 2.0 * (hm * hm + hm * ho);
  const double patch_flops = n * 2.0 * p * hv;
  c.forward_flops = patch_flops + linear_flops + attn_flops;
  // Backward: input and weight gradients (the patch embedding's weight gradient only: pixels need
  // none); attention at flash attention's 2.5x.
  if (trains) c.backward_flops = patch_flops + 2.0 * linear_flops + 2.5 * attn_flops;
  // Checkpointed blocks run their forward again in backward, and write their saved sets again.
  if (ckpt) c.recompute_flops = n * depth * block_linear + attn_flops;
  c.backward_flops += c.recompute_flops;
  c.forward_traffic_bytes = 2.0 * saved;
  c.backward_traffic_bytes = trains ? 2.0 * c.forward_traffic_bytes : 0.0;
  if (ckpt) c.backward_traffic_bytes += 2.0 * n * depth * block_saved;
  return c;
}

}  // namespace memplan
