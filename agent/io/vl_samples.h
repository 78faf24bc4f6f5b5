// Image + text samples for a vision-language model (docs/agent.md, "Vision-language data"): a
// sample file written by scripts/prepare-vl-data.py, or synthetic samples of N images of H x W,
// and the micro-batches made of them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/io/safetensors_reader.h"
#include "agent/model/vision_tower.h"
#include "common/types.h"

namespace memplan::io {

// One sample: token ids with their labels (aligned with the ids, -100 not scored; the batch
// shifts them) and the images its runs of image tokens stand for.
struct VlSample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;
  VisionInputs images;  // pixel_values as stored (fp32, bf16 or fp16), grids int64
};

// A sample file: one safetensors file with
//   input_ids      int64 [tokens]         every sample's ids, one sample after the other
//   labels         int64 [tokens]         optional; default input_ids with image tokens -100
//   sample_tokens  int64 [samples + 1]    where each sample's tokens start (0 first, tokens last)
//   image_grid_thw int64 [images, 3]      every image's (t, h, w) in patches, in sample order
//   sample_images  int64 [samples + 1]    where each sample's images start
//   pixel_values   F32|BF16|F16 [patches, C·T·P·P]  as the processor emits them, image after image
// Open reads everything but pixel_values, which Read reads per sample (one positional read).
// Thread-safe after Open.
class VlSampleFile {
 public:
  // INVALID_ARGUMENT naming the tensor for a missing or malformed one, a patch width other than
  // spec.vision.PatchDim(), an id outside the vocabulary, or a sample whose runs of image tokens
  // do not match its grids (MropePositions' rule).
  static absl::StatusOr<std::unique_ptr<VlSampleFile>> Open(const std::string& path,
                                                            const ModelSpec& spec);

  int64_t num_samples() const { return static_cast<int64_t>(sample_tokens_.size()) - 1; }
  int64_t num_images() const { return static_cast<int64_t>(grids_.size() / 3); }
  // Tokens of the longest sample.
  int64_t max_sample_tokens() const { return max_tokens_; }
  absl::StatusOr<VlSample> Read(int64_t sample) const;

  // The sample whose images have the most patches (the first of equals; sample -1 when no sample
  // has an image): its image count and patches, and the grid of its image with the most patches.
  struct ImageExtent {
    int64_t sample = -1;
    int64_t images = 0;
    int64_t patches = 0;       // Σ t·h·w over the sample's images
    int64_t largest_rows = 0;  // h of its largest image, in patches
    int64_t largest_cols = 0;  // w of its largest image, in patches
  };
  ImageExtent LargestSample() const;

 private:
  VlSampleFile() = default;

  std::unique_ptr<SafetensorsReader> reader_;
  const SafetensorsTensorInfo* pixels_ = nullptr;
  std::vector<int64_t> ids_, labels_, sample_tokens_, grids_, sample_images_;
  std::vector<int64_t> image_patches_;  // where each image's patches start, images + 1 entries
  int64_t max_tokens_ = 0;
};

// Synthetic samples for benchmarks: `images` images of height x width pixels (multiples of
// patch_size · spatial_merge_size) with seeded normal pixel values, each between vision_start and
// vision_end after a few text tokens, text to seq_len. INVALID_ARGUMENT when they do not fit.
struct SyntheticVlOptions {
  int64_t images = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t seq_len = 0;
  uint64_t seed = 0;
};
absl::Status CheckSyntheticVl(const ModelSpec& spec, const SyntheticVlOptions& options);
VlSample SyntheticVlSample(const ModelSpec& spec, const SyntheticVlOptions& options,
                           int64_t index);

// A micro-batch of `batch_size` samples padded to seq_len: targets[t] = labels[t + 1] (-100 past
// the sample's end, padding ids 0), the samples' images in row order.
struct VlBatch {
  torch::Tensor input_ids;  // int64 [batch, seq]
  torch::Tensor targets;    // int64 [batch, seq]
  VisionInputs images;
};

// Deterministic micro-batches: sample g = (step · world_size + rank) · batch_size + row of the
// run is sample PermuteIndex(g mod S) of epoch g / S (each epoch its own seeded order), as the
// token batcher draws windows. Samples are never cut: one longer than seq_len is refused (an
// image's tokens stay whole). Thread-compatible.
class VlBatcher {
 public:
  struct Options {
    uint64_t seed = 0;
    int64_t batch_size = 1;
    int64_t seq_len = 0;
    int rank = 0;
    int world_size = 1;
  };
  // From a sample file (`file`) or, with file null, synthetic samples.
  static absl::StatusOr<std::unique_ptr<VlBatcher>> Create(const ModelSpec& spec,
                                                           std::shared_ptr<const VlSampleFile> file,
                                                           const SyntheticVlOptions& synthetic,
                                                           const Options& options);
  absl::StatusOr<VlBatch> Batch(int64_t step) const;

 private:
  VlBatcher() = default;

  ModelSpec spec_;
  std::shared_ptr<const VlSampleFile> file_;
  SyntheticVlOptions synthetic_;
  Options options_;
};

}  // namespace memplan::io
