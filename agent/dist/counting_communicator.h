// CountingCommunicator: forwards every collective to another Communicator and counts the calls
// by kind, so that a test (or a report) can show how many collectives a step issues. Not
// thread-safe, like the Communicator it wraps.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "agent/dist/communicator.h"

namespace memplan {

struct CollectiveCounts {
  int64_t all_gathers = 0;  // tensors gathered, a coalesced call counting each of its tensors
  int64_t coalesced_gather_calls = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;
};

class CountingCommunicator final : public Communicator {
 public:
  // `inner` is not owned and must outlive this object.
  explicit CountingCommunicator(Communicator* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  torch::Device device() const override { return inner_->device(); }
  std::unique_ptr<PendingCollective> AllGather(torch::Tensor output, torch::Tensor input) override {
    ++counts_.all_gathers;
    return inner_->AllGather(std::move(output), std::move(input));
  }
  std::unique_ptr<PendingCollective> AllGatherCoalesced(std::vector<torch::Tensor> outputs,
                                                        std::vector<torch::Tensor> inputs) override {
    counts_.all_gathers += static_cast<int64_t>(outputs.size());
    ++counts_.coalesced_gather_calls;
    return inner_->AllGatherCoalesced(std::move(outputs), std::move(inputs));
  }
  std::unique_ptr<PendingCollective> ReduceScatterSum(torch::Tensor output,
                                                      torch::Tensor input) override {
    ++counts_.reduce_scatters;
    return inner_->ReduceScatterSum(std::move(output), std::move(input));
  }
  std::unique_ptr<PendingCollective> ReduceScatterSumWidened(torch::Tensor output,
                                                             torch::Tensor input) override {
    ++counts_.reduce_scatters;
    return inner_->ReduceScatterSumWidened(std::move(output), std::move(input));
  }
  std::unique_ptr<PendingCollective> AllReduceSum(torch::Tensor tensor) override {
    ++counts_.all_reduces;
    return inner_->AllReduceSum(std::move(tensor));
  }

  const CollectiveCounts& counts() const { return counts_; }

 private:
  Communicator* inner_;
  CollectiveCounts counts_;
};

}  // namespace memplan
