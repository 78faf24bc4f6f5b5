#include "agent/model/vision_tower.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/blocks/group_runner.h"
#include "agent/model/layers.h"
#include "common/param_shapes.h"
#include "common/vision_kind.h"

namespace memplan {
namespace {

// transformers hard-codes the epsilon of the tower's norms (RMSNorm and LayerNorm alike).
constexpr double kVisionNormEps = 1e-6;

// The block's or merger's norm: LayerNorm with a bias (Qwen2-VL) or RMSNorm.
torch::Tensor Norm(const ModelSpec& spec, const torch::Tensor& x, const torch::Tensor& weight,
                   const torch::Tensor& bias) {
  if (!VisionLayerNorm(spec)) return RmsNormUnfused(x, weight, kVisionNormEps);
  return at::layer_norm(x, {x.size(-1)}, weight, bias, kVisionNormEps);
}

struct Grid {
  int64_t t, h, w;
};

std::vector<Grid> Grids(const ModelSpec& spec, const VisionInputs& images) {
  const VisionSpec& v = spec.vision;
  TORCH_CHECK(images.image_grid_thw.dim() == 2 && images.image_grid_thw.size(1) == 3,
              "vision tower: image_grid_thw must be [images, 3]");
  const torch::Tensor g = images.image_grid_thw.to(torch::kCPU, torch::kLong).contiguous();
  auto a = g.accessor<int64_t, 2>();
  std::vector<Grid> grids;
  int64_t patches = 0;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const Grid grid{a[i][0], a[i][1], a[i][2]};
    TORCH_CHECK(grid.t >= 1 && grid.h >= 1 && grid.w >= 1 && grid.h % v.spatial_merge_size == 0 &&
                    grid.w % v.spatial_merge_size == 0,
                "vision tower: image ", i, " has grid (", grid.t, ", ", grid.h, ", ", grid.w,
                "); h and w must be positive multiples of spatial_merge_size ",
                v.spatial_merge_size);
    patches += grid.t * grid.h * grid.w;
    grids.push_back(grid);
  }
  TORCH_CHECK(images.pixel_values.dim() == 2 && images.pixel_values.size(0) == patches &&
                  images.pixel_values.size(1) == v.PatchDim(),
              "vision tower: pixel_values must be [", patches, ", ", v.PatchDim(),
              "] for these grids (patches x channels·temporal_patch·patch²), got ",
              images.pixel_values.sizes());
  return grids;
}

// Every patch's (row, column) in the image, in the order the processor emits the patches:
// frame by frame, spatial_merge_size² blocks in row-major order, row-major inside a block.
torch::Tensor PatchPositions(const std::vector<Grid>& grids, int64_t m) {
  std::vector<int64_t> rows, cols;
  for (const Grid& g : grids) {
    for (int64_t t = 0; t < g.t; ++t) {
      for (int64_t br = 0; br < g.h / m; ++br) {
        for (int64_t bc = 0; bc < g.w / m; ++bc) {
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < m; ++j) {
              rows.push_back(br * m + i);
              cols.push_back(bc * m + j);
            }
          }
        }
      }
    }
  }
  return torch::stack({torch::tensor(rows), torch::tensor(cols)}, 1);  // [patches, 2]
}

// transformers' get_vision_window_index: the merged patches reordered window by window (windows
// of `span` merged patches a side, row-major over each frame; cells row-major inside a window), and
// the windows' boundaries in patches. Windows cut off by the image's edge are smaller.
struct Windows {
  torch::Tensor index;              // [merged patches] int64, the new order
  std::vector<int64_t> boundaries;  // cumulative, in patches, starting at 0
};

Windows WindowOrder(const std::vector<Grid>& grids, int64_t m, int64_t span) {
  std::vector<int64_t> index;
  std::vector<int64_t> bounds = {0};
  int64_t offset = 0;
  for (const Grid& g : grids) {
    const int64_t lh = g.h / m, lw = g.w / m;
    for (int64_t t = 0; t < g.t; ++t) {
      for (int64_t wr = 0; wr < lh; wr += span) {
        for (int64_t wc = 0; wc < lw; wc += span) {
          int64_t cells = 0;
          for (int64_t r = wr; r < std::min(wr + span, lh); ++r) {
            for (int64_t c = wc; c < std::min(wc + span, lw); ++c, ++cells) {
              index.push_back(offset + t * lh * lw + r * lw + c);
            }
          }
          bounds.push_back(bounds.back() + cells * m * m);
        }
      }
    }
    offset += g.t * lh * lw;
  }
  return Windows{torch::tensor(index), std::move(bounds)};
}

// Each frame of each image attends within itself (transformers' cu_seqlens).
std::vector<int64_t> FrameBoundaries(const std::vector<Grid>& grids) {
  std::vector<int64_t> bounds = {0};
  for (const Grid& g : grids) {
    for (int64_t t = 0; t < g.t; ++t) bounds.push_back(bounds.back() + g.h * g.w);
  }
  return bounds;
}

// Rows of `x` ([merged patches · m², ...]) moved in groups of m² to the order `index`.
torch::Tensor PermuteMerged(const torch::Tensor& x, const torch::Tensor& index, int64_t unit) {
  const int64_t n = x.size(0);
  return x.reshape({n / unit, unit, -1}).index_select(0, index).reshape({n, -1});
}

torch::Tensor Attention(const ModelSpec& spec, const VisionParams& p, int64_t b,
                        const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<int64_t>& bounds) {
  const VisionSpec& v = spec.vision;
  const int64_t n = x.size(0);
  const int64_t heads = v.num_heads;
  const int64_t d = v.HeadDim();
  const torch::Tensor qkv =
      Linear(x, p.block(b, VisionParams::kQkvW), p.block(b, VisionParams::kQkvB))
          .reshape({n, 3, heads, d})
          .permute({1, 0, 2, 3});
  // 2-D rotary embedding in fp32, cast back (apply_rotary_pos_emb_vision).
  auto rotate = [&](const torch::Tensor& t) {
    const torch::Tensor f = t.to(torch::kFloat32);
    return (f * cos + RotateHalf(f) * sin).to(t.scalar_type());
  };
  const torch::Tensor q = rotate(qkv[0]).transpose(0, 1).unsqueeze(0);  // [1, heads, n, d]
  const torch::Tensor k = rotate(qkv[1]).transpose(0, 1).unsqueeze(0);
  const torch::Tensor vv = qkv[2].transpose(0, 1).unsqueeze(0);
  std::vector<torch::Tensor> outs;
  for (size_t i = 1; i < bounds.size(); ++i) {
    const int64_t a = bounds[i - 1], e = bounds[i];
    if (e == a) continue;
    outs.push_back(
        at::scaled_dot_product_attention(q.slice(2, a, e), k.slice(2, a, e), vv.slice(2, a, e))
            .transpose(1, 2));  // [1, len, heads, d]
  }
  const torch::Tensor attn = torch::cat(outs, 1).reshape({n, heads * d});
  return Linear(attn, p.block(b, VisionParams::kProjW), p.block(b, VisionParams::kProjB));
}

torch::Tensor Mlp(const ModelSpec& spec, const VisionParams& p, int64_t b, const torch::Tensor& x) {
  using V = VisionParams;
  if (!VisionGatedMlp(spec)) {
    // fc1 -> QuickGELU (x·sigmoid(1.702·x), transformers' quick_gelu) -> fc2.
    const torch::Tensor h = Linear(x, p.block(b, V::kUpW), p.block(b, V::kUpB));
    return Linear(h * torch::sigmoid(1.702 * h), p.block(b, V::kDownW), p.block(b, V::kDownB));
  }
  const torch::Tensor gate = torch::silu(Linear(x, p.block(b, V::kGateW), p.block(b, V::kGateB)));
  const torch::Tensor up = Linear(x, p.block(b, V::kUpW), p.block(b, V::kUpB));
  return Linear(gate * up, p.block(b, V::kDownW), p.block(b, V::kDownB));
}

bool BlockTrains(const VisionParams& p, int64_t b) {
  for (int64_t i = 0; i < p.per_block; ++i) {
    if (p.tensors[static_cast<size_t>(1 + b * p.per_block + i)].requires_grad()) return true;
  }
  return false;
}

}  // namespace

VisionParams VisionParams::Shaped(const ModelSpec& spec) {
  VisionParams p;
  p.depth = spec.vision.depth;
  for (ParamShape& s : VisionParamShapes(spec)) {
    p.names.push_back(std::move(s.name));
    p.shapes.push_back(std::move(s.shape));
  }
  p.tensors.resize(p.names.size());
  // Roles by the names' endings within block 0 and the merger.
  const VisionSpec& v = spec.vision;
  p.per_block =
      v.depth > 0
          ? (static_cast<int64_t>(p.names.size()) - 1 - (VisionLayerNorm(spec) ? 6 : 5)) / v.depth
          : 0;
  const std::pair<BlockTensor, const char*> block_roles[] = {
      {kNorm1, "norm1.weight"},
      {kNorm1Bias, "norm1.bias"},
      {kNorm2, "norm2.weight"},
      {kNorm2Bias, "norm2.bias"},
      {kQkvW, "attn.qkv.weight"},
      {kQkvB, "attn.qkv.bias"},
      {kProjW, "attn.proj.weight"},
      {kProjB, "attn.proj.bias"},
      {kGateW, "mlp.gate_proj.weight"},
      {kGateB, "mlp.gate_proj.bias"},
      {kUpW, VisionGatedMlp(spec) ? "mlp.up_proj.weight" : "mlp.fc1.weight"},
      {kUpB, VisionGatedMlp(spec) ? "mlp.up_proj.bias" : "mlp.fc1.bias"},
      {kDownW, VisionGatedMlp(spec) ? "mlp.down_proj.weight" : "mlp.fc2.weight"},
      {kDownB, VisionGatedMlp(spec) ? "mlp.down_proj.bias" : "mlp.fc2.bias"},
  };
  p.block_slot.fill(-1);
  for (const auto& [role, suffix] : block_roles) {
    for (int64_t i = 0; i < p.per_block; ++i) {
      if (p.names[static_cast<size_t>(1 + i)] == absl::StrCat("visual.blocks.0.", suffix)) {
        p.block_slot[role] = i;
      }
    }
  }
  const std::pair<MergerTensor, const char*> merger_roles[] = {
      {kLnQ, "ln_q.weight"},  {kLnQBias, "ln_q.bias"},  {kMlp0W, "mlp.0.weight"},
      {kMlp0B, "mlp.0.bias"}, {kMlp2W, "mlp.2.weight"}, {kMlp2B, "mlp.2.bias"},
  };
  p.merger_slot.fill(-1);
  const size_t merger_begin = static_cast<size_t>(1 + p.depth * p.per_block);
  for (const auto& [role, suffix] : merger_roles) {
    for (size_t i = merger_begin; i < p.names.size(); ++i) {
      if (p.names[i] == absl::StrCat("visual.merger.", suffix)) {
        p.merger_slot[role] = static_cast<int64_t>(i - merger_begin);
      }
    }
  }
  return p;
}

std::vector<NamedParam> VisionParams::Named() const {
  std::vector<NamedParam> out;
  for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], tensors[i]});
  return out;
}

VisionInputs ImagesOfRows(const ModelSpec& spec, const VisionInputs& images,
                          const torch::Tensor& input_ids, int64_t begin, int64_t end) {
  if (images.num_images() == 0) return images;
  const torch::Tensor image = (input_ids.to(torch::kCPU) == spec.image_token_id).to(torch::kLong);
  // A run starts where an image token follows a non-image token (or the row's start).
  const torch::Tensor starts =
      image - torch::nn::functional::pad(image, torch::nn::functional::PadFuncOptions({1, 0}))
                  .slice(1, 0, image.size(1));
  const torch::Tensor runs = (starts == 1).sum(1).cumsum(0);
  const int64_t first = begin == 0 ? 0 : runs[begin - 1].item<int64_t>();
  const int64_t last = end == 0 ? 0 : runs[end - 1].item<int64_t>();
  TORCH_CHECK(runs[-1].item<int64_t>() <= images.num_images(), "input_ids hold ",
              runs[-1].item<int64_t>(), " runs of image tokens for ", images.num_images(),
              " images");
  const torch::Tensor grids = images.image_grid_thw.to(torch::kCPU, torch::kLong);
  const torch::Tensor patches = grids.prod(1).cumsum(0);
  const int64_t row_begin = first == 0 ? 0 : patches[first - 1].item<int64_t>();
  const int64_t row_end = last == 0 ? 0 : patches[last - 1].item<int64_t>();
  return VisionInputs{images.pixel_values.slice(0, row_begin, row_end),
                      images.image_grid_thw.slice(0, first, last)};
}

torch::Tensor VisionTowerForward(const ModelSpec& spec, const VisionParams& p,
                                 const VisionInputs& images, bool checkpoint_blocks) {
  const VisionSpec& v = spec.vision;
  const std::vector<Grid> grids = Grids(spec, images);
  const int64_t m = v.spatial_merge_size;
  const int64_t unit = m * m;
  const torch::Tensor& w = p.patch_embed();
  const torch::Device device = w.device();

  // The patch embedding (a Conv3d whose stride is its kernel) is a linear map of each flattened
  // patch.
  torch::Tensor x = Linear(images.pixel_values.to(device, w.scalar_type()), w);
  // A tower without windows keeps the processor's order (no permutation, whole-frame bounds).
  const Windows windows =
      VisionWindowed(v) ? WindowOrder(grids, m, v.WindowMergedPatches()) : Windows{};
  const torch::Tensor index = VisionWindowed(v) ? windows.index.to(device) : torch::Tensor();
  if (VisionWindowed(v)) x = PermuteMerged(x, index, unit);

  // 2-D rotary angles: a quarter of the head's dimensions turn with the row, a quarter with the
  // column, each pair as halves of the head (Qwen2_5_VLVisionRotaryEmbedding).
  const int64_t half_dim = v.HeadDim() / 2;
  const torch::Tensor inv_freq =
      torch::pow(v.rope_theta, torch::arange(0, half_dim, 2, torch::kFloat32) / half_dim)
          .reciprocal();
  const torch::Tensor positions = PatchPositions(grids, m).to(device);
  const torch::Tensor angles =
      positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.to(device);  // [n, 2, d / 4]
  auto layout = [&](const torch::Tensor& f) {
    const torch::Tensor hw = torch::cat({f.select(1, 0), f.select(1, 1)}, -1);
    const torch::Tensor both = torch::cat({hw, hw}, -1);
    return (VisionWindowed(v) ? PermuteMerged(both, index, unit) : both)
        .unsqueeze(-2);  // [n, 1, d]
  };
  const torch::Tensor cos = layout(angles.cos());
  const torch::Tensor sin = layout(angles.sin());

  const std::vector<int64_t> frames = FrameBoundaries(grids);
  for (int64_t b = 0; b < v.depth; ++b) {
    const std::vector<int64_t>& bounds =
        VisionFullAttentionBlock(v, b) ? frames : windows.boundaries;
    // By value but for the spec and parameters, which outlive the step: a checkpointed block
    // runs again in backward. The input is dropped once the attention's residual is added, so a
    // block that records nothing holds one residual stream during its MLP, as common/vision_cost
    // prices it.
    auto block = [&spec, &p, b, cos, sin, bounds](torch::Tensor in) {
      using V = VisionParams;
      const torch::Tensor h =
          in + Attention(spec, p, b,
                         Norm(spec, in, p.block(b, V::kNorm1), p.block(b, V::kNorm1Bias)), cos, sin,
                         bounds);
      in.reset();
      return h + Mlp(spec, p, b, Norm(spec, h, p.block(b, V::kNorm2), p.block(b, V::kNorm2Bias)));
    };
    // [Vision block checkpointing] The block runs in its own autograd node in CKPT mode
    // (agent/blocks/group_runner.h, no residency: its parameters are group 0's): its forward
    // keeps only its input, its backward recomputes it with the forward's RNG state and runs the
    // recomputed graph's backward, accumulating the block's parameter gradients there. A tower
    // recording no graph (frozen, or no grad mode) runs plainly: a node would only keep inputs.
    if (checkpoint_blocks && torch::GradMode::is_enabled() &&
        (x.requires_grad() || BlockTrains(p, b))) {
      GroupSpec group;
      group.group = -1;  // no ParamResidency is told
      group.mode = BlockMode::kCkpt;
      group.body = block;
      x = RunGroup(group, x, GroupRunnerOptions{});
    } else {
      x = block(std::move(x));
    }
  }

  using V = VisionParams;
  torch::Tensor merged =
      Norm(spec, x, p.merger(V::kLnQ), p.merger(V::kLnQBias)).reshape({x.size(0) / unit, -1});
  merged = Linear(merged, p.merger(V::kMlp0W), p.merger(V::kMlp0B));
  merged = Linear(torch::gelu(merged), p.merger(V::kMlp2W), p.merger(V::kMlp2B));
  return VisionWindowed(v) ? merged.index_select(0, torch::argsort(index)) : merged;
}

}  // namespace memplan
