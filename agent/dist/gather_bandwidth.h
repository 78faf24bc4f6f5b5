// CompareGatherTimes: the all-gathers one rank timed, compared with the same gathers on every
// other rank, as bus bandwidth (a benchmark report's figure, not used in training).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/dist/communicator.h"

namespace memplan {

// [Collective timing] A collective's device time on one rank runs from its start there to its
// end, so it includes waiting for the last rank to arrive: per gather, the fastest rank's time is
// the transfer itself (that rank arrived last). Bus bandwidth (output bytes x (W - 1) / W per
// second) of the sampled gathers by the fastest and by the slowest rank of each.
struct GatherBandwidth {
  int64_t gathers = 0;
  double fastest_bus_bytes_per_second = 0;
  double slowest_bus_bytes_per_second = 0;
};

// `seconds_each`: the device seconds of each sampled all-gather, in the order every rank finishes
// them; `sampled_bytes`: their output bytes together. A collective on every rank of `comm` (an
// all-reduce, then an all-gather); nullopt on every rank when there are no samples or the ranks'
// counts differ.
absl::StatusOr<std::optional<GatherBandwidth>> CompareGatherTimes(
    Communicator& comm, const std::vector<float>& seconds_each, int64_t sampled_bytes);

}  // namespace memplan
