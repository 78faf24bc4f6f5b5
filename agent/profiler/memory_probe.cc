#include "agent/profiler/memory_probe.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "common/log.h"

namespace memplan {
namespace {

using c10::CachingDeviceAllocator::StatType;

class CudaMemoryProbe final : public MemoryProbe {
 public:
  explicit CudaMemoryProbe(c10::DeviceIndex device) : device_(device) {}

  int64_t AllocatedBytes() override { return Stats().allocated_bytes[kAggregate].current; }
  int64_t PeakAllocatedBytes() override { return Stats().allocated_bytes[kAggregate].peak; }
  void ResetPeak() override { c10::cuda::CUDACachingAllocator::resetPeakStats(device_); }
  int64_t ReservedBytes() override { return Stats().reserved_bytes[kAggregate].current; }
  void Synchronize() override { torch::cuda::synchronize(device_); }
  std::string source() const override { return "cuda_caching_allocator"; }

 private:
  static constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);
  c10::CachingDeviceAllocator::DeviceStats Stats() {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_);
  }
  c10::DeviceIndex device_;
};

// c10's CPU allocator reports every allocation and free to the MemoryReportingInfoBase found in
// the thread-local debug info when that reporter says memory profiling is on; autograd carries
// the debug info to its worker threads. This is the autograd profiler's own memory hook.
class CpuReporter final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    std::lock_guard<std::mutex> lock(mu_);
    current_ += alloc_size;
    peak_ = std::max(peak_, current_);
  }
  bool memoryProfilingEnabled() const override { return true; }

  int64_t current() {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  void ResetPeak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = current_;
  }

 private:
  std::mutex mu_;
  int64_t current_ = 0;
  int64_t peak_ = 0;
};

class CpuMemoryProbe final : public MemoryProbe {
 public:
  CpuMemoryProbe()
      : reporter_(std::make_shared<CpuReporter>()),
        guard_(c10::DebugInfoKind::PROFILER_STATE, reporter_) {}

  int64_t AllocatedBytes() override { return reporter_->current(); }
  int64_t PeakAllocatedBytes() override { return reporter_->peak(); }
  void ResetPeak() override { reporter_->ResetPeak(); }
  int64_t ReservedBytes() override { return reporter_->current(); }
  void Synchronize() override {}
  std::string source() const override { return "cpu_allocator_reports"; }

 private:
  std::shared_ptr<CpuReporter> reporter_;
  c10::DebugInfoGuard guard_;
};

}  // namespace

std::unique_ptr<MemoryProbe> MemoryProbe::Create(torch::Device device) {
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : c10::DeviceIndex{0};
    return std::make_unique<CudaMemoryProbe>(index);
  }
  return std::make_unique<CpuMemoryProbe>();
}

c10::DeviceIndex CudaIndex(const torch::Device& device) {
  return device.index() < 0 ? c10::DeviceIndex{0} : device.index();
}

AllocatorStats ReadAllocatorStats(const torch::Device& device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device));
  const auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
  return {stats.allocated_bytes[aggregate], stats.reserved_bytes[aggregate]};
}

}  // namespace memplan
