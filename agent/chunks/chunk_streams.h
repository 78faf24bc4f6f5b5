// ChunkStreams: the side streams chunk traffic runs on (uploads and all-gathers; grad copies to
// the host) and the events that order them against the compute stream. On a CPU device every
// call is a no-op. Not thread-safe. Private to agent/chunks.
#pragma once

#include <memory>
#include <optional>

#include "agent/core/torch_pch.h"

#if __has_include(<c10/cuda/CUDAStream.h>)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define MEMPLAN_CHUNKS_CUDA 1
#endif

namespace memplan::chunks {

#ifdef MEMPLAN_CHUNKS_CUDA
using Event = at::cuda::CUDAEvent;
#else
struct Event {
  void synchronize() const {}
};
#endif
using EventPtr = std::shared_ptr<Event>;

class ChunkStreams {
 public:
  explicit ChunkStreams(torch::Device device) : device_(device) {}

  // Takes the side streams from the pool (CUDA devices only).
  void Init() {
#ifdef MEMPLAN_CHUNKS_CUDA
    if (cuda()) {
      upload_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
      offload_ = c10::cuda::getStreamFromPool(false, device_.index());
      update_in_ = c10::cuda::getStreamFromPool(false, device_.index());
      update_out_ = c10::cuda::getStreamFromPool(false, device_.index());
    }
#endif
  }

  bool cuda() const { return device_.is_cuda(); }

  // An event recorded now on the compute (current) stream; null on a CPU device.
  EventPtr RecordOnCompute() const {
#ifdef MEMPLAN_CHUNKS_CUDA
    if (!cuda()) return nullptr;
    auto event = std::make_shared<Event>();
    event->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return event;
#else
    return nullptr;
#endif
  }

  // The compute stream waits for `event` (if any).
  void WaitOnCompute(const EventPtr& event) const {
#ifdef MEMPLAN_CHUNKS_CUDA
    if (event) event->block(c10::cuda::getCurrentCUDAStream(device_.index()));
#else
    (void)event;
#endif
  }

  // The host waits for everything queued on both side streams.
  void Synchronize() const {
#ifdef MEMPLAN_CHUNKS_CUDA
    if (cuda()) {
      upload_->synchronize();
      offload_->synchronize();
    }
#endif
  }

#ifdef MEMPLAN_CHUNKS_CUDA
  // Host-to-device uploads, shard copies and the all-gathers ordered after them.
  c10::cuda::CUDAStream& upload() { return *upload_; }
  // Device-to-host grad copies.
  c10::cuda::CUDAStream& offload() { return *offload_; }
  // [Device updates of offloaded chunks]: copies in and the update; copies back to the host.
  c10::cuda::CUDAStream& update_in() { return *update_in_; }
  c10::cuda::CUDAStream& update_out() { return *update_out_; }
#endif

 private:
  torch::Device device_;
#ifdef MEMPLAN_CHUNKS_CUDA
  std::optional<c10::cuda::CUDAStream> upload_;
  std::optional<c10::cuda::CUDAStream> offload_;
  std::optional<c10::cuda::CUDAStream> update_in_;
  std::optional<c10::cuda::CUDAStream> update_out_;
#endif
};

}  // namespace memplan::chunks
