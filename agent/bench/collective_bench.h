// Collective benchmark for world size > 1: all-gather and reduce-scatter bus bandwidth between the
// ranks of a torchrun-style group (rank 0 hosts a c10d TCPStore at master_addr:master_port), over
// NCCL on CUDA (bf16) or Gloo on the CPU (fp32). Every rank calls MeasureCollectives once, at the
// same time; each verifies the data of both collectives once, and all get the same figures.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agent/dist/dist_options.h"

namespace memplan {

// Up to 256 ranks: bf16 holds every sum of the reduce-scatter check exactly.
inline constexpr int kMaxCollectiveWorldSize = kMaxDistWorldSize;
inline constexpr int64_t kMaxCollectiveMessageBytes = int64_t{1} << 36;

using CollectiveBackend = DistBackend;  // the process group's backend (agent/dist)

inline absl::string_view CollectiveBackendName(CollectiveBackend backend) {
  return DistBackendName(backend);
}

struct CollectiveBenchOptions {
  int world_size = 1;  // 1: nothing to measure
  int rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Rank 0 only: a socket already listening on master_port that the store takes over, so that a
  // caller that picked an ephemeral port keeps it (c10d's masterListenFd); -1: bind master_port.
  int master_listen_fd = -1;
  // The store is served already (torchrun's agent store, TORCHELASTIC_USE_AGENT_STORE=True):
  // rank 0 connects to it as a client like the others.
  bool store_already_served = false;
  CollectiveBackend backend = CollectiveBackend::kAuto;
  int device_index = 0;  // the CUDA device of this rank (NCCL)
  // The all-gather's total output = the reduce-scatter's total input, rounded down to a multiple
  // of world_size elements (nccl-tests' "size"); 0: 256 MiB (the hardware bench: transfer_bytes).
  int64_t message_bytes = 0;
  int warmup_ops = 2;    // untimed, after the one checked op of each collective
  int repetitions = 10;  // timed runs; the figure is the median (the slowest rank's)
  int ops_per_run = 5;   // back-to-back ops per timed run (amortises the start skew of the ranks)
  int timeout_seconds = 600;  // rendezvous and each collective
  // [Collectives under compute] Also time both collectives while a matrix-multiply load runs
  // beside them (CUDA: bf16 GEMMs on another stream of the same device; the CPU: fp32 matmuls on
  // another thread), as chunk gathers and reduce-scatters run inside a training step.
  bool under_compute = true;
};

// INVALID_ARGUMENT naming the field and its allowed range.
absl::Status ValidateCollectiveBenchOptions(const CollectiveBenchOptions& options);

// One collective's figures (nccl-tests' convention): algbw = bytes / time, with bytes the total
// output of the all-gather or the total input of the reduce-scatter; busbw = algbw * (n - 1) / n.
struct CollectiveFigures {
  absl::Status status;    // OK, or why this collective was not measured (or returned wrong data)
  bool verified = false;  // the checked op returned the expected data on every rank
  double median_seconds = 0;  // per op, slowest rank
  double best_seconds = 0;
  double algbw_bytes_per_second = 0;  // from the median
  double busbw_bytes_per_second = 0;
};

struct CollectiveBenchResult {
  absl::Status status;  // OK once the group formed; else why nothing was measured
  CollectiveBackend backend = CollectiveBackend::kAuto;  // the one used (never kAuto once formed)
  std::string dtype;                                     // "bf16" (NCCL) or "fp32" (Gloo)
  int world_size = 1;
  int64_t message_bytes = 0;  // after rounding
  CollectiveFigures allgather;
  CollectiveFigures reduce_scatter;
  // The same collectives and message, timed with the compute load running ([Collectives under
  // compute]); status says why not when they were not measured (under_compute off, or the plain
  // measurement failed).
  CollectiveFigures allgather_under_compute;
  CollectiveFigures reduce_scatter_under_compute;
};

// The group this benchmark joins (agent/dist's ProcessGroup), from its options.
DistOptions CollectiveDistOptions(const CollectiveBenchOptions& options, CollectiveBackend backend);

// Joins the group, measures both collectives and leaves it. Blocks until every rank has joined
// (or timeout_seconds pass). Never throws; errors are in the result's statuses.
CollectiveBenchResult MeasureCollectives(const CollectiveBenchOptions& options);

}  // namespace memplan
