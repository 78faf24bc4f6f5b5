#include "agent/train/vl_data.h"

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

absl::StatusOr<MicroBatch> NextVlBatch(const io::VlBatcher& batcher, int64_t position) {
  ASSIGN_OR_RETURN(io::VlBatch batch, batcher.Batch(position));
  return MicroBatch{batch.input_ids, batch.targets, batch.images};
}

}  // namespace memplan
