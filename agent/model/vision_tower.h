// Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel): patches ->
// patch embedding -> blocks with 2-D rotary attention over windows (or the whole image for the
// full-attention blocks), never across images -> patch merger to the language model's width.
// Qwen2-VL's (Qwen2VisionTransformerPretrainedModel) is the same with common/vision_kind.h's
// differences: LayerNorm, fc1 -> QuickGELU -> fc2, every block over the whole image.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "agent/core/param_residency.h"
#include "agent/core/torch_pch.h"
#include "common/types.h"

namespace memplan {

// A micro-batch's images as Qwen2.5-VL's processor emits them: pixel_values [patches, C·T·P·P]
// (each row one flattened patch, images one after the other, every image's patches in the order
// of its spatial_merge_size² blocks) and image_grid_thw int64 [images, 3] (t, h, w in patches).
// The images follow the order of their runs of image tokens in input_ids, row by row.
struct VisionInputs {
  torch::Tensor pixel_values;
  torch::Tensor image_grid_thw;

  int64_t num_images() const { return image_grid_thw.defined() ? image_grid_thw.size(0) : 0; }
};

// The tower's parameters in [Parameter order] (common/param_shapes.h, VisionParamShapes) under
// their checkpoint names ("visual.*"). Not thread-safe.
struct VisionParams {
  // Names and shapes for `spec`; tensors undefined for the model's initialisation to fill (the
  // vector is never resized, so their addresses stay put).
  static VisionParams Shaped(const ModelSpec& spec);

  // A block's and the merger's tensors by role. The variant lacks some (Qwen2.5-VL the norm
  // biases, Qwen2-VL the gate; fc1/fc2 take the up/down roles): block() and merger() give an
  // undefined tensor for those.
  enum BlockTensor {
    kNorm1,
    kNorm1Bias,
    kNorm2,
    kNorm2Bias,
    kQkvW,
    kQkvB,
    kProjW,
    kProjB,
    kGateW,
    kGateB,
    kUpW,
    kUpB,
    kDownW,
    kDownB,
    kBlockRoles
  };
  enum MergerTensor { kLnQ, kLnQBias, kMlp0W, kMlp0B, kMlp2W, kMlp2B, kMergerRoles };
  const torch::Tensor& patch_embed() const { return tensors[0]; }
  const torch::Tensor& block(int64_t b, BlockTensor which) const {
    const int64_t slot = block_slot[which];
    return slot < 0 ? absent : tensors[static_cast<size_t>(1 + b * per_block + slot)];
  }
  const torch::Tensor& merger(MergerTensor which) const {
    const int64_t slot = merger_slot[which];
    return slot < 0 ? absent : tensors[static_cast<size_t>(1 + depth * per_block + slot)];
  }
  std::vector<NamedParam> Named() const;

  int64_t depth = 0;
  int64_t per_block = 0;  // tensors of each block
  // Each role's position within a block's (the merger's) tensors, -1 where the variant lacks it.
  std::array<int64_t, kBlockRoles> block_slot{};
  std::array<int64_t, kMergerRoles> merger_slot{};
  torch::Tensor absent;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<torch::Tensor> tensors;
};

// The images of rows [begin, end) of `input_ids` out of `images`, the images of all its rows in
// order (one per run of image tokens): how a batch's images split into micro-batches. TORCH_CHECK
// when the runs outnumber the images.
VisionInputs ImagesOfRows(const ModelSpec& spec, const VisionInputs& images,
                          const torch::Tensor& input_ids, int64_t begin, int64_t end);

// The tower's output: [sum over images of t·h·w / m², out_hidden_size] in the parameters' dtype,
// images in order, each image's merged patches in row-major order. Checks the inputs against
// `spec` (TORCH_CHECK, naming what disagrees).
// `checkpoint_blocks` ([Vision block checkpointing] in the .cc): when the tower records a graph
// (grad mode on and something in it trains), each block keeps only its input and is recomputed
// in backward; same values and gradients. `spec` and `params` must then outlive the backward.
torch::Tensor VisionTowerForward(const ModelSpec& spec, const VisionParams& params,
                                 const VisionInputs& images, bool checkpoint_blocks = false);

}  // namespace memplan
