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

// Micro-batch `position` of `batcher` as the trainer takes it.
absl::StatusOr<MicroBatch> NextVlBatch(const io::VlBatcher& batcher, int64_t position);

}  // namespace memplan
