// Communicator: the collectives the chunk manager and the trainer need from a process group
// (one rank's view), behind a narrow interface. The real one is ProcessGroup (process_group.h).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"

namespace memplan {

// A started collective. Not thread-safe.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Blocks until the collective has finished (CUDA: until the current stream is ordered after
  // it). A failure names this rank and, where it can be told, the rank that is gone.
  virtual absl::Status Wait() = 0;
  // [Collective timing] The collective's own duration on the device as the backend measured it
  // (NCCL: its start and end events on the communication stream), after Wait() returned OK.
  // UNAVAILABLE while it still runs and `wait` is false (with `wait` it blocks until the
  // collective finished); UNIMPLEMENTED where the backend does not time collectives (Gloo) or
  // once answered. What the collective held is released once this answers.
  virtual absl::StatusOr<double> DeviceSeconds(bool wait) {
    return absl::UnimplementedError("this backend does not time collectives");
  }
};

// Several started collectives, waited for and timed as one (Communicator::AllGatherCoalesced's
// default): Wait() waits for each in order and answers the first failure; DeviceSeconds sums
// their durations (they run one after another on the backend's stream).
class PendingCollectives final : public PendingCollective {
 public:
  explicit PendingCollectives(std::vector<std::unique_ptr<PendingCollective>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Wait() override {
    absl::Status first;
    for (auto& part : parts_) {
      const absl::Status s = part->Wait();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
  absl::StatusOr<double> DeviceSeconds(bool wait) override {
    double total = 0;
    for (auto& part : parts_) {
      absl::StatusOr<double> s = part->DeviceSeconds(wait);
      if (!s.ok()) return s.status();
      total += *s;
    }
    return total;
  }

 private:
  std::vector<std::unique_ptr<PendingCollective>> parts_;
};

// nccl-tests' bus bandwidth of an all-gather: its output bytes per second x (W - 1) / W (what
// each rank's link carries). `memplan-agent bench` stores the measured figure in the profile.
inline double AllGatherBusBytesPerSecond(double output_bytes, double seconds, int world_size) {
  return seconds > 0 ? output_bytes / seconds * (world_size - 1) / world_size : 0.0;
}

// Every rank must start the same collectives in the same order, with tensors of the same sizes
// and dtypes on device(). Tensors must stay alive and untouched until Wait() returns.
// Thread-compatible: calls from one thread at a time.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where collective tensors live: the CPU (Gloo) or this rank's CUDA device (NCCL).
  virtual torch::Device device() const = 0;
  // output (contiguous, world_size × input.numel()) ← every rank's input, in rank order.
  virtual std::unique_ptr<PendingCollective> AllGather(torch::Tensor output,
                                                       torch::Tensor input) = 0;
  // outputs[i] ← every rank's inputs[i] for each i, as AllGather does, started as one collective
  // where the backend can (c10d: allgather_into_tensor_coalesced, one NCCL group call and kernel
  // for the list). The default starts one AllGather per pair and waits for them together.
  virtual std::unique_ptr<PendingCollective> AllGatherCoalesced(std::vector<torch::Tensor> outputs,
                                                                std::vector<torch::Tensor> inputs) {
    std::vector<std::unique_ptr<PendingCollective>> parts;
    for (size_t i = 0; i < outputs.size(); ++i) parts.push_back(AllGather(outputs[i], inputs[i]));
    return std::make_unique<PendingCollectives>(std::move(parts));
  }
  // output (contiguous, input.numel() / world_size) ← the sum over ranks of this rank's slice.
  virtual std::unique_ptr<PendingCollective> ReduceScatterSum(torch::Tensor output,
                                                              torch::Tensor input) = 0;
  // tensor ← the sum over ranks, in place.
  virtual std::unique_ptr<PendingCollective> AllReduceSum(torch::Tensor tensor) = 0;
  // [Narrow reduce-scatter] output (fp32, contiguous, input.numel() / world_size) ← the sum over
  // ranks of this rank's slice of a 16-bit input, each term widened to fp32 and summed there: the
  // values of an fp32 reduce-scatter of the widened input, for half its bytes on the link. The
  // default widens and reduce-scatters in fp32; a backend may exchange the 16-bit slices and sum
  // them locally (ProcessGroup: an all-to-all, then the sum in rank order when Wait() returns).
  virtual std::unique_ptr<PendingCollective> ReduceScatterSumWidened(torch::Tensor output,
                                                                     torch::Tensor input) {
    return ReduceScatterSum(std::move(output), input.to(torch::kFloat32));
  }
};

}  // namespace memplan
