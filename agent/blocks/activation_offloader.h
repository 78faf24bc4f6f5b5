// ActivationOffloader: moves activations of SWAP and HS_OFFLOAD blocks to host memory during
// forward (device→host on a side stream) and brings them back in backward (host→device on another
// side stream, one group ahead). On CPU the same paths run with synchronous copies.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "common/types.h"

namespace memplan {

struct ActivationOffloadOptions {
  torch::Device device = torch::kCPU;
  HostMemoryKind host_memory = HostMemoryKind::kPinned;
  // [Sources released in program order] Groups whose activations are on the device at once in
  // forward: the sources of group g's device→host copies are held until the end of group
  // g + max_in_flight_groups - 1's forward, where forward waits for those copies and frees them.
  // 2 (the default) overlaps each group's copies with the next group's compute, as the cost
  // model prices it (ForwardWindow) and holds one predecessor's saved set beside a group's own
  // (ModeValue).
  int max_in_flight_groups = 2;
  // [Exact pinned host copies] (activation_offloader.cc): pinned copies at their exact size in a
  // pool of this offloader's, instead of torch's caching host allocator (which rounds each to a
  // power of two). Its GPU test passes; its speed against the caching allocator is not yet
  // measured. memplan-agent train sets it where the plan leaves no room for the rounding
  // ([Pinned copies by the plan's room], agent/train/train_config.h).
  bool exact_pinned_host = false;
};

struct ActivationOffloadStats {
  int64_t offloaded_bytes = 0;      // total device→host bytes copied so far
  int64_t host_bytes = 0;           // host copies alive now
  int64_t host_bytes_peak = 0;      // largest host_bytes seen
  int64_t passthrough_tensors = 0;  // saved tensors kept in place (parameters)
  int64_t synchronous_fetches = 0;  // backward needed data that was not prefetched
  int64_t in_flight_waits = 0;      // forward waited for an old group's copies
  bool pinned = false;              // host copies are in pinned memory
  int64_t pageable_reuses = 0;      // pageable host copies written into a kept storage
  int64_t exact_pinned_reuses = 0;  // exact-size pinned copies written into a kept storage
  int64_t shared_saves = 0;         // saves of a tensor already offloaded in its group
};

// Thread-compatible. Forward calls come from the training thread and backward calls from
// autograd's worker thread; autograd serialises them (the training thread waits in backward).
// Must outlive every autograd graph built under it (its hooks point back to it).
class ActivationOffloader {
 public:
  static absl::StatusOr<std::unique_ptr<ActivationOffloader>> Create(
      const ActivationOffloadOptions& options);
  ~ActivationOffloader();

  // While the returned scope is alive on this thread, every tensor autograd saves for backward is
  // copied to host memory for `group`, except parameters (leaves that require grad, other than
  // `block_input`), which are kept as they are. Installs the saved-tensor-hook engine on first use.
  class SwapScope {
   public:
    ~SwapScope();
    SwapScope(const SwapScope&) = delete;
    SwapScope& operator=(const SwapScope&) = delete;

   private:
    friend class ActivationOffloader;
    explicit SwapScope(void* previous) : previous_(previous) {}
    void* previous_;
  };
  std::unique_ptr<SwapScope> BeginSwap(int group, const torch::Tensor& block_input);

  // HS_OFFLOAD: starts copying `input` (the block input) to host memory for `group`.
  void OffloadInput(int group, const torch::Tensor& input);
  // Ends `group`'s forward (every group, whatever its mode): its copies count as in flight, and
  // the sources of older groups' copies are waited for and freed (see max_in_flight_groups).
  void EndForwardGroup(int group);

  // Starts bringing back what `group` offloaded (no-op if nothing or already started).
  void Prefetch(int group);
  // HS_OFFLOAD: the block input of `group` on the device, safe to use on the current stream.
  torch::Tensor TakeInput(int group);
  // Forgets `group` (after its backward): drops host copies and bookkeeping.
  void Clear(int group);
  // Forgets everything (e.g. after an exception in the middle of a step).
  void ClearAll();

  ActivationOffloadStats Stats() const;
  const ActivationOffloadOptions& options() const;

  class Impl;

 private:
  explicit ActivationOffloader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memplan
