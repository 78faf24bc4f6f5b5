// The vision-language data of a training run (docs/agent.md, "Vision-language data"): which
// source a run's flags and model call for, and its micro-batches.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/io/vl_samples.h"
#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "common/types.h"

namespace memplan {

// Whether the data flags suit the model (the refusals below), before anything is loaded.
absl::Status CheckVlData(const TrainConfig& config, const ModelSpec& spec);

// The batcher of --data-vl FILE or --synthetic-images N --image-size HxW; null for a text model
// given text data. FAILED_PRECONDITION for a vision-language model given text data (it is never
// trained text-only: its vision tower would be left out), for image data given a text model, and
// for --eval-tokens with a vision-language model; the sample file's errors as VlSampleFile::Open.
absl::StatusOr<std::unique_ptr<io::VlBatcher>> OpenVlData(const TrainConfig& config,
                                                          const ModelSpec& spec, int rank,
                                                          int world_size);

// The images a run describes to the planner (Workload::images_per_sample, image_height and
// image_width), and the sample they stand for.
struct VlWorkloadImages {
  int32_t images_per_sample = 0;
  int64_t image_height = 0;  // pixels
  int64_t image_width = 0;
  int64_t sample = -1;            // --data-vl: the file's sample with the most patches
  int64_t sample_patches = 0;     // its patches (Σ t·h·w)
  int64_t described_patches = 0;  // images_per_sample · the described image's patches
};

// [Largest VL sample] The workload holds one image size, a sample file many: it describes the
// file's sample with the most patches, as its image count of images as tall as its largest image
// and just wide enough (in merged patches) that the described patches are never fewer than the
// sample's. The tower's bytes grow with the patches, so the plan is never under-counted for any
// sample. --synthetic-images: the flags' images. Nothing for a text model. FAILED_PRECONDITION
// for a sample file without images; the file's errors as VlSampleFile::Open.
absl::StatusOr<VlWorkloadImages> DescribeVlImages(const TrainConfig& config, const ModelSpec& spec);

// Micro-batch `position` of `batcher` as the trainer takes it.
absl::StatusOr<MicroBatch> NextVlBatch(const io::VlBatcher& batcher, int64_t position);

}  // namespace memplan
