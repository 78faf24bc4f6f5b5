// ProcessGroup: this process's membership of a c10d process group — the TCPStore at
// master_addr:master_port (served by rank 0, or torchrun's agent store) and ProcessGroupNCCL on
// CUDA or ProcessGroupGloo on the CPU — with every collective under options.timeout_seconds and
// failures that name the rank that is gone. The one place in the agent that creates a group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "agent/dist/dist_options.h"

namespace memplan {

// The backend `requested` resolves to on this machine and build (kAuto: NCCL when CUDA is usable,
// else Gloo); FAILED_PRECONDITION when this build or machine cannot run it.
absl::StatusOr<DistBackend> ResolveDistBackend(DistBackend requested);

// The NCCL version this build's process group loads ("2.27.3"), or "none" when the build has no
// NCCL process group. For --version and `memplan env`.
std::string NcclVersionText();

// Not thread-safe (one thread issues collectives); runs its own heartbeat thread.
class ProcessGroup final : public Communicator {
 public:
  // Joins the group; blocks until every rank has joined or timeout_seconds pass. The NCCL backend
  // makes options.local_rank the current CUDA device. Errors name the rank, the world size, the
  // backend and the address.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Join(const DistOptions& options);
  // [Leaving] Marks this rank done in the store; rank 0 (whose store the others use) waits for
  // every mark before it goes, but not for a rank whose heartbeat stopped without one, and after
  // a failure only a few heartbeats.
  ~ProcessGroup() override;

  int rank() const override;
  int world_size() const override;
  torch::Device device() const override;
  DistBackend backend() const;  // never kAuto
  const DistOptions& options() const;

  std::unique_ptr<PendingCollective> AllGather(torch::Tensor output, torch::Tensor input) override;
  std::unique_ptr<PendingCollective> AllGatherCoalesced(std::vector<torch::Tensor> outputs,
                                                        std::vector<torch::Tensor> inputs) override;
  std::unique_ptr<PendingCollective> ReduceScatterSum(torch::Tensor output,
                                                      torch::Tensor input) override;
  std::unique_ptr<PendingCollective> ReduceScatterSumWidened(torch::Tensor output,
                                                             torch::Tensor input) override;
  std::unique_ptr<PendingCollective> AllReduceSum(torch::Tensor tensor) override;
  absl::Status Barrier();

  class Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memplan
