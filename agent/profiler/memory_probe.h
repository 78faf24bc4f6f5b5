// MemoryProbe: allocated / peak / reserved bytes of one device's tensor memory, the same calls on
// CUDA (the caching allocator's statistics) and on CPU (allocations reported by c10's CPU
// allocator to a reporter this probe installs on the creating thread), so the profiler's memory
// logic runs and is tested on CPU too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Allocator.h>

#include "agent/core/torch_pch.h"

namespace memplan {

// Thread-safe. CPU: counts only tensors allocated while the probe exists, on threads that inherit
// the creating thread's debug info (the caller and autograd's workers), so create it before the
// work it measures and keep it alive until the work is done.
class MemoryProbe {
 public:
  static std::unique_ptr<MemoryProbe> Create(torch::Device device);
  virtual ~MemoryProbe() = default;

  // Bytes of live tensor allocations. CPU: relative to the probe's creation (may be negative if
  // older tensors are freed; those frees are not reported by c10 and so do not count).
  virtual int64_t AllocatedBytes() = 0;
  // Largest AllocatedBytes() since the last ResetPeak() (or creation).
  virtual int64_t PeakAllocatedBytes() = 0;
  virtual void ResetPeak() = 0;
  // Bytes the allocator holds from the device (CUDA caching allocator); CPU: AllocatedBytes().
  virtual int64_t ReservedBytes() = 0;
  // Allocator detail (CUDA; CPU: active = allocated, the rest 0). Active bytes are allocated bytes
  // plus freed blocks still waiting for another stream's work (record_stream) before reuse.
  struct Detail {
    int64_t active = 0;
    int64_t peak_active = 0;     // since the last ResetPeak()
    int64_t inactive_split = 0;  // free pieces of partly used segments (fragmentation)
    int64_t device_allocs = 0;   // segment allocations / expansions so far
  };
  virtual Detail AllocatorDetail() = 0;
  // Waits for queued device work (CUDA); no-op on CPU.
  virtual void Synchronize() = 0;
  // "cuda_caching_allocator" or "cpu_allocator_reports".
  virtual std::string source() const = 0;
};

// The CUDA device index of `device` (0 for an index-less "cuda").
c10::DeviceIndex CudaIndex(const torch::Device& device);

// The CUDA caching allocator's aggregate allocated / reserved statistics of `device` (current and
// peak since the last reset); call only for a CUDA device.
struct AllocatorStats {
  c10::CachingAllocator::Stat allocated, reserved;
};
AllocatorStats ReadAllocatorStats(const torch::Device& device);

// One line per (stream, pool) of the caching allocator's segments on `device`: reserved,
// allocated, active (allocated + waiting on other streams) and segment count, largest first;
// which streams' pools hold the reserved memory (the compute stream's pool is not shared).
std::string SegmentsByStream(const torch::Device& device);

}  // namespace memplan
