#include "agent/train/vl_data.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan {

absl::Status CheckVlData(const TrainConfig& c, const ModelSpec& spec) {
  const bool image_data = !c.vl_data_file.empty() || c.synthetic_images > 0;
  if (!spec.IsVisionLanguage()) {
    if (!image_data) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        c.vl_data_file.empty() ? "--synthetic-images" : "--data-vl", " needs a vision-language "
        "model (qwen2_5_vl); ", spec.name, " (", spec.family, ") has no vision tower"));
  }
  if (!image_data) {
    return absl::FailedPreconditionError(absl::StrCat(
        spec.name, " is a vision-language model (", spec.family, ", ", spec.vision.depth,
        " vision blocks): train it on images with --data-vl FILE (scripts/prepare-vl-data.py) "
        "or --synthetic-images N --image-size HxW; text-only data would leave its vision tower "
        "out of the run and its memory"));
  }
  if (!c.eval_tokens_file.empty()) {
    return absl::FailedPreconditionError(
        "--eval-tokens is text-only; held-out evaluation of a vision-language model is not "
        "supported yet");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<io::VlBatcher>> OpenVlData(const TrainConfig& c,
                                                          const ModelSpec& spec, int rank,
                                                          int world_size) {
  RETURN_IF_ERROR(CheckVlData(c, spec));
  if (!spec.IsVisionLanguage()) return std::unique_ptr<io::VlBatcher>();
  std::shared_ptr<const io::VlSampleFile> file;
  if (!c.vl_data_file.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<io::VlSampleFile> opened,
                     io::VlSampleFile::Open(c.vl_data_file, spec));
    file = std::move(opened);
  }
  io::SyntheticVlOptions synthetic;
  synthetic.images = c.synthetic_images;
  synthetic.height = c.image_height;
  synthetic.width = c.image_width;
  synthetic.seed = c.seed;
  io::VlBatcher::Options options;
  options.seed = c.seed;
  options.batch_size = c.batch;
  options.seq_len = c.seq;
  options.rank = rank;
  options.world_size = world_size;
  return io::VlBatcher::Create(spec, std::move(file), synthetic, options);
}

absl::StatusOr<VlWorkloadImages> DescribeVlImages(const TrainConfig& c, const ModelSpec& spec) {
  VlWorkloadImages d;
  if (!spec.IsVisionLanguage()) return d;
  const VisionSpec& v = spec.vision;
  if (c.vl_data_file.empty()) {
    d.images_per_sample = static_cast<int32_t>(c.synthetic_images);
    d.image_height = c.image_height;
    d.image_width = c.image_width;
    return d;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<io::VlSampleFile> file,
                   io::VlSampleFile::Open(c.vl_data_file, spec));
  const io::VlSampleFile::ImageExtent largest = file->LargestSample();
  if (largest.sample < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-vl ", c.vl_data_file, ": no sample holds an image; ", spec.name,
                     " is a vision-language model and is never planned or trained text-only"));
  }
  // [Largest VL sample] Rows: the largest image's. Columns: the fewest whole merged columns that
  // cover the sample's patches over its images (at most the largest image's own width).
  const int64_t m = v.spatial_merge_size;
  const int64_t rows = largest.largest_rows;
  const int64_t per_image = (largest.patches + largest.images - 1) / largest.images;
  const int64_t cols = std::max<int64_t>(1, (per_image + rows * m - 1) / (rows * m)) * m;
  d.images_per_sample = static_cast<int32_t>(largest.images);
  d.image_height = rows * v.patch_size;
  d.image_width = cols * v.patch_size;
  d.sample = largest.sample;
  d.sample_patches = largest.patches;
  d.described_patches = largest.images * rows * cols;
  return d;
}

absl::StatusOr<MicroBatch> NextVlBatch(const io::VlBatcher& batcher, int64_t position) {
  ASSIGN_OR_RETURN(io::VlBatch batch, batcher.Batch(position));
  return MicroBatch{batch.input_ids, batch.targets, batch.images};
}

}  // namespace memplan
