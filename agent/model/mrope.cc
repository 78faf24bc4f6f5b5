#include "agent/model/mrope.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace memplan {

absl::StatusOr<torch::Tensor> MropePositions(const ModelSpec& spec, const torch::Tensor& input_ids,
                                             const torch::Tensor& image_grid_thw) {
  if (input_ids.dim() != 2) {
    return absl::InvalidArgumentError("M-RoPE: input_ids must be [batch, seq]");
  }
  const torch::Tensor ids = input_ids.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t images = image_grid_thw.defined() ? image_grid_thw.size(0) : 0;
  torch::Tensor grids = torch::zeros({0, 3}, torch::kLong);
  if (images > 0) {
    if (image_grid_thw.dim() != 2 || image_grid_thw.size(1) != 3) {
      return absl::InvalidArgumentError("M-RoPE: image_grid_thw must be [images, 3]");
    }
    grids = image_grid_thw.to(torch::kCPU, torch::kLong).contiguous();
  }
  const int64_t batch = ids.size(0);
  const int64_t seq = ids.size(1);
  const int64_t m = spec.vision.spatial_merge_size;
  torch::Tensor out = torch::empty({3, batch, seq}, torch::kLong);
  auto id = ids.accessor<int64_t, 2>();
  auto grid = grids.accessor<int64_t, 2>();
  auto pos = out.accessor<int64_t, 3>();
  int64_t next_image = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t position = 0;
    for (int64_t s = 0; s < seq;) {
      if (id[b][s] == spec.video_token_id) {
        return absl::InvalidArgumentError(absl::StrCat(
            "M-RoPE: input_ids row ", b, " holds a video token (", spec.video_token_id,
            ") at ", s, "; videos are not supported"));
      }
      if (id[b][s] != spec.image_token_id) {
        for (int64_t c = 0; c < 3; ++c) pos[c][b][s] = position;
        ++position;
        ++s;
        continue;
      }
      int64_t end = s;
      while (end < seq && id[b][end] == spec.image_token_id) ++end;
      if (next_image >= images) {
        return absl::InvalidArgumentError(absl::StrCat(
            "M-RoPE: input_ids hold more runs of image tokens than image_grid_thw has images (",
            images, "); row ", b, " position ", s));
      }
      const int64_t t = grid[next_image][0], h = grid[next_image][1], w = grid[next_image][2];
      if (t < 1 || h < 1 || w < 1 || h % m != 0 || w % m != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "M-RoPE: image ", next_image, " has grid (", t, ", ", h, ", ", w,
            "); h and w must be positive multiples of spatial_merge_size ", m));
      }
      const int64_t gh = h / m, gw = w / m;
      if (end - s != t * gh * gw) {
        return absl::InvalidArgumentError(absl::StrCat(
            "M-RoPE: image ", next_image, " (grid ", t, "x", h, "x", w, ") needs ", t * gh * gw,
            " image tokens; row ", b, " has a run of ", end - s, " at ", s));
      }
      int64_t k = s;
      for (int64_t ti = 0; ti < t; ++ti) {
        for (int64_t hi = 0; hi < gh; ++hi) {
          for (int64_t wi = 0; wi < gw; ++wi, ++k) {
            pos[0][b][k] = position + ti;
            pos[1][b][k] = position + hi;
            pos[2][b][k] = position + wi;
          }
        }
      }
      position += std::max(h, w) / m;
      s = end;
      ++next_image;
    }
  }
  if (next_image != images) {
    return absl::InvalidArgumentError(absl::StrCat("M-RoPE: image_grid_thw has ", images,
                                                   " images but input_ids hold ", next_image,
                                                   " runs of image tokens"));
  }
  return out;
}

torch::Tensor MropeAngles(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                          const std::vector<int64_t>& sections) {
  // [3, batch, seq, half]: every stream's angles; section i keeps stream i of its columns.
  // Selecting before cos/sin gives the same values as transformers' selecting after.
  const torch::Tensor all =
      positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.to(positions.device());
  std::vector<torch::Tensor> parts;
  int64_t begin = 0;
  for (size_t i = 0; i < sections.size(); ++i) {
    parts.push_back(all[static_cast<int64_t>(i % 3)].slice(-1, begin, begin + sections[i]));
    begin += sections[i];
  }
  return torch::cat(parts, -1);
}

}  // namespace memplan
