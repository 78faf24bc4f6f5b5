// Hardware benchmark for the planner's HardwareSpec: host<->device bandwidth (pinned, pageable,
// both directions at once) at chunk-sized transfers, HBM copy bandwidth, bf16/fp16/fp32 matmul
// throughput, CUDA context overhead, GPU and host memory, memlock limit, the CPU optimizer rates
// of agent/chunks (the fused pass and, apart, its accumulate and update passes: [Two CPU passes]
// in common/optimizer_bytes.h) and, with world size > 1, all-gather / reduce-scatter bus bandwidth
// between the ranks (collective_bench.h). Without CUDA only the host figures are measured (and the
// GPU part says why).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/bench/collective_bench.h"
#include "common/types.h"

namespace memplan {

struct HardwareBenchOptions {
  int device_index = 0;
  std::string name;                             // profile name; empty: the GPU's name (or "cpu")
  int64_t transfer_bytes = int64_t{256} << 20;  // one host<->device copy (a large chunk)
  int transfer_repetitions = 5;                 // best of these, after one warm-up copy
  int64_t hbm_copy_bytes = int64_t{1} << 30;    // device-to-device copy (shrunk to free memory)
  int64_t matmul_size = 8192;                   // n of the n x n x n products (shrunk to memory)
  int matmul_repetitions = 10;
  // CPU optimizer passes (agent/chunks kernels): elements per array, 256 MiB of fp32 by default,
  // beyond any last-level cache; each pass runs at least adam_repetitions times and at least
  // adam_min_seconds in all, and reports its median run.
  int64_t adam_params = int64_t{64} << 20;
  int adam_repetitions = 3;
  double adam_min_seconds = 0.5;
  int adam_threads = 0;  // 0: one per hardware thread
  // world_size > 1: every rank runs MeasureHardware at once and, after its own figures, the
  // collectives with the others. Its message_bytes 0 means transfer_bytes; its device_index is
  // replaced by device_index above.
  CollectiveBenchOptions collective;
  // Receives one line per finished measurement; empty: structured log lines on stderr.
  std::function<void(const std::string& line)> progress;
};

struct BenchFigure {
  std::string name;  // e.g. "h2d_pinned"
  double value = 0;
  std::string unit;  // "GB/s", "TFLOP/s", "Mparams/s", "GiB"
  std::string note;
};

struct HardwareBenchResult {
  HardwareSpec spec;        // every figure measured so far; measured = true only when complete
  absl::Status gpu_status;  // OK, FAILED_PRECONDITION without CUDA, or why the GPU part failed
  std::vector<BenchFigure> figures;
  // World size > 1: the collectives' figures, and OK or the first reason one was not measured
  // (no group, wrong data, an unsupported collective). OK with world size 1.
  CollectiveBenchResult collectives;
  absl::Status collective_status;
  double seconds = 0;  // wall time of the whole benchmark
};

// Measures what it can; never fails as a whole (see gpu_status). Not thread-safe with other work
// on the same GPU: the figures assume the device is otherwise idle.
HardwareBenchResult MeasureHardware(const HardwareBenchOptions& options);

// The spec to submit with SubmitHardwareProfile: every field the planner requires measured, or
// the reason it could not be (FAILED_PRECONDITION on a machine without CUDA).
absl::StatusOr<HardwareSpec> RunHardwareBench(const HardwareBenchOptions& options);

// A readable table of the figures.
std::string FormatBenchTable(const HardwareBenchResult& result);

}  // namespace memplan
