// Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel): patches ->
// patch embedding -> blocks with 2-D rotary attention over windows (or the whole image for the
// full-attention blocks), never across images -> patch merger to the language model's width.
#pragma once

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

  static constexpr int64_t kPerBlock = 12;
  // Index of each of a block's tensors in its kPerBlock.
  enum BlockTensor {
    kNorm1, kNorm2, kQkvW, kQkvB, kProjW, kProjB, kGateW, kGateB, kUpW, kUpB, kDownW, kDownB
  };
  enum MergerTensor { kLnQ, kMlp0W, kMlp0B, kMlp2W, kMlp2B };
  const torch::Tensor& patch_embed() const { return tensors[0]; }
  const torch::Tensor& block(int64_t b, BlockTensor which) const {
    return tensors[static_cast<size_t>(1 + b * kPerBlock + which)];
  }
  const torch::Tensor& merger(MergerTensor which) const {
    return tensors[static_cast<size_t>(1 + depth * kPerBlock + which)];
  }
  std::vector<NamedParam> Named() const;

  int64_t depth = 0;
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
torch::Tensor VisionTowerForward(const ModelSpec& spec, const VisionParams& params,
                                 const VisionInputs& images);

}  // namespace memplan
