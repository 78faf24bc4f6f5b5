#include "agent/profiler/device_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstdio>

#include "agent/profiler/memory_probe.h"

namespace memplan {

AllocatorPeaks ReadAllocatorPeaks(const torch::Device& device) {
  AllocatorPeaks peaks;
  if (!device.is_cuda() || !torch::cuda::is_available()) return peaks;
  const AllocatorStats stats = ReadAllocatorStats(device);
  peaks.allocated_bytes = stats.allocated.peak;
  peaks.reserved_bytes = stats.reserved.peak;
  return peaks;
}

AllocatorCounters ReadAllocatorCounters(const torch::Device& device) {
  AllocatorCounters counters;
  if (!device.is_cuda()) return counters;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device));
  counters.alloc_retries = stats.num_alloc_retries;
  counters.device_allocations = stats.num_device_alloc;
  return counters;
}

std::optional<DeviceMemInfo> ReadDeviceMemInfo(const torch::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  c10::cuda::CUDAGuard guard(CudaIndex(device));
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return std::nullopt;
  return DeviceMemInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

int64_t DeviceUsedBytes(const torch::Device& device) {
  const std::optional<DeviceMemInfo> info = ReadDeviceMemInfo(device);
  return info.has_value() ? info->total_bytes - info->free_bytes : 0;
}

void ReleaseCachedAndResetPeaks(const torch::Device& device) {
  if (!device.is_cuda()) return;
  torch::cuda::synchronize(CudaIndex(device));
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device));
}

HostMemory ReadHostMemory() {
  HostMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) m.rss = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) m.peak_rss = kib * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace memplan
