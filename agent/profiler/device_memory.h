// One-shot readings of this process's device and host memory, outside any MemoryProbe: the
// caching allocator's peaks and counters, the device's used bytes (every process and the CUDA
// context included), the resident set. Every reading is 0 (or empty) on CPU, where there is no
// device figure, so callers print and report the same fields on either device.
#pragma once

#include <cstdint>
#include <optional>

#include "agent/core/torch_pch.h"

namespace memplan {

// Bytes as MiB, the unit of the agent's human-readable lines.
inline double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// The caching allocator's allocated / reserved peaks since the last reset; zeros on CPU. Asked of
// the allocator directly, so it holds after an OOM lost a step's own statistics.
struct AllocatorPeaks {
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
};
AllocatorPeaks ReadAllocatorPeaks(const torch::Device& device);

// The caching allocator's event counters since the process started; zeros on CPU.
struct AllocatorCounters {
  int64_t alloc_retries = 0;       // cached blocks freed to satisfy an allocation
  int64_t device_allocations = 0;  // segments allocated from the device
};
AllocatorCounters ReadAllocatorCounters(const torch::Device& device);

// cudaMemGetInfo of a CUDA device; nullopt on CPU or when the call fails.
struct DeviceMemInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
std::optional<DeviceMemInfo> ReadDeviceMemInfo(const torch::Device& device);

// Device-level used bytes (total - free); 0 on CPU or when unreadable.
int64_t DeviceUsedBytes(const torch::Device& device);

// Hands cached-but-free device memory back and starts new peaks, so that earlier work (profiling,
// model loading) neither sits in the pool nor in the peaks a later phase is measured by. No-op
// on CPU.
void ReleaseCachedAndResetPeaks(const torch::Device& device);

// This process's resident set now and at its peak (VmRSS, VmHWM of /proc/self/status), bytes;
// zeros where the file is unreadable.
struct HostMemory {
  int64_t rss = 0;
  int64_t peak_rss = 0;
};
HostMemory ReadHostMemory();

}  // namespace memplan
