// Qwen2.5-VL's multimodal rotary positions (M-RoPE): each token has a temporal, a height and a
// width position; text tokens have the same value in all three, the merged patches of an image the
// coordinates of their grid cell, offset by the position where the image starts.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "common/types.h"

namespace memplan {

// The [3, batch, seq] int64 positions of transformers' get_rope_index on the CPU, with no padding
// mask (trailing padding is text). In each row, text tokens count up one by one; a run of
// spec.image_token_id tokens takes the next image of `image_grid_thw` ([images, 3] (t, h, w) in
// patches; undefined for none), whose t · (h / m) · (w / m) cells (m = spatial_merge_size) get
// start + (t, row, column) in row-major order, and text resumes at start + max(h, w) / m.
// INVALID_ARGUMENT when the runs and the grids disagree (count or length), for a video token, or a
// grid not divisible by the merge size.
absl::StatusOr<torch::Tensor> MropePositions(const ModelSpec& spec, const torch::Tensor& input_ids,
                                             const torch::Tensor& image_grid_thw);

// The rotary angles [batch, seq, inv_freq.numel()] of `positions` ([3, batch, seq]): the first
// sections[0] frequencies rotated by the temporal positions, the next sections[1] by the height
// ones, the rest by the width ones (transformers' mrope_section), in fp32 on positions' device.
torch::Tensor MropeAngles(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                          const std::vector<int64_t>& sections);

}  // namespace memplan
