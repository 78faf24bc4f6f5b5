// Test seam of collective_bench.h: the same measurement over a c10d backend formed by the caller
// (a fake group in tests) instead of a TCPStore group.
// Private to agent/bench and its tests: it names c10d types.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "agent/bench/collective_bench.h"

namespace memplan {

// `backend` says where the buffers live and their type: kNccl = options.device_index in bf16,
// otherwise the CPU in fp32.
CollectiveBenchResult MeasureCollectivesOn(const CollectiveBenchOptions& options,
                                           CollectiveBackend backend,
                                           c10::intrusive_ptr<c10d::Backend> process_group);

}  // namespace memplan
