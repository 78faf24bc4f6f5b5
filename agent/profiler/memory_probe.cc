#include "agent/profiler/memory_probe.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

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
  Detail AllocatorDetail() override {
    const auto stats = Stats();
    Detail d;
    d.active = stats.active_bytes[kAggregate].current;
    d.peak_active = stats.active_bytes[kAggregate].peak;
    d.inactive_split = stats.inactive_split_bytes[kAggregate].current;
    d.device_allocs = stats.num_device_alloc;
    return d;
  }
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
  Detail AllocatorDetail() override {
    Detail d;
    d.active = reporter_->current();
    d.peak_active = reporter_->peak();
    return d;
  }
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

namespace memplan {

std::string SegmentsByStream(const torch::Device& device) {
  struct Pool {
    int64_t reserved = 0, allocated = 0, active = 0, segments = 0;
  };
  std::map<std::pair<void*, bool>, Pool> pools;
  const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false);
  const c10::DeviceIndex index = CudaIndex(device);
  for (const auto& seg : snapshot.segments) {
    if (seg.device != index) continue;
    Pool& p = pools[{seg.stream, seg.is_large}];
    p.reserved += static_cast<int64_t>(seg.total_size);
    p.allocated += static_cast<int64_t>(seg.allocated_size);
    p.active += static_cast<int64_t>(seg.active_size);
    ++p.segments;
  }
  std::vector<std::pair<std::pair<void*, bool>, Pool>> sorted(pools.begin(), pools.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.reserved > b.second.reserved; });
  const void* current = c10::cuda::getCurrentCUDAStream(index).stream();
  std::string out;
  constexpr double kMiB = 1 << 20;
  for (const auto& [key, p] : sorted) {
    absl::StrAppendFormat(&out,
                          "stream %p%s %s pool: reserved %.0f MiB, allocated %.0f MiB, active "
                          "%.0f MiB, %lld segments\n",
                          key.first, key.first == current ? " (current)" : "",
                          key.second ? "large" : "small", p.reserved / kMiB, p.allocated / kMiB,
                          p.active / kMiB, static_cast<long long>(p.segments));
  }
  return out;
}

}  // namespace memplan
