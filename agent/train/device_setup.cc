#include "agent/train/device_setup.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "agent/profiler/device_memory.h"
#include "agent/profiler/memory_probe.h"
#include "common/log.h"

namespace memplan {

absl::StatusOr<torch::Device> ResolveDevice(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  try {
    torch::Device device(name);
    if (device.is_cuda() && !torch::cuda::is_available()) {
      return absl::FailedPreconditionError("--device " + name + ": CUDA is not available");
    }
    return device;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError("--device " + name + ": " + e.what_without_backtrace());
  }
}

void PrintDeviceMemory(const torch::Device& device, const char* stage) {
  if (!device.is_cuda()) return;
  const AllocatorStats stats = ReadAllocatorStats(device);
  std::printf(
      "device memory %s: allocated %.0f MiB (peak %.0f), reserved %.0f MiB (peak %.0f), "
      "device used %.0f MiB\n",
      stage, MiB(stats.allocated.current), MiB(stats.allocated.peak), MiB(stats.reserved.current),
      MiB(stats.reserved.peak), MiB(DeviceUsedBytes(device)));
}

void ConfigureAllocator(const TrainConfig& config, const torch::Device& device) {
  if (!device.is_cuda()) return;
  std::string conf;
  if (config.allocator_conf.has_value()) {
    conf = *config.allocator_conf;
  } else if (std::getenv("PYTORCH_CUDA_ALLOC_CONF") == nullptr) {
    conf = "expandable_segments:True";
  }
  if (!conf.empty()) c10::CachingAllocator::setAllocatorSettings(conf);
  // Initialise the context and the caching allocator now: their statistics are read before the
  // first tensor reaches the device when the model is built in host memory.
  (void)torch::empty({1}, torch::TensorOptions().device(device));
  MEMPLAN_LOG(kInfo, "cuda allocator")
      .Field("settings", conf.empty() ? std::string("(pytorch default or environment)") : conf);
}

absl::Status ApplyMemoryLimit(const TrainConfig& config, const torch::Device& device,
                              const PlanAnswer* answer) {
  if (config.memory_limit_bytes == 0) return absl::OkStatus();
  int64_t limit = config.memory_limit_bytes;
  if (limit < 0) {
    if (answer == nullptr) {
      return absl::InvalidArgumentError(
          "--memory-limit plan: needs --planner (the predicted reserved peak comes from it); give "
          "a size in MiB instead");
    }
    limit = answer->prediction.peak_bytes - answer->prediction.breakdown.cuda_context_bytes;
  }
  if (!device.is_cuda()) {
    std::printf("note: --memory-limit applies to CUDA devices only; ignored on %s\n",
                device.str().c_str());
    return absl::OkStatus();
  }
  size_t free_bytes = 0, total_bytes = 0;
  {
    c10::cuda::CUDAGuard guard(CudaIndex(device));
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  if (limit <= 0 || limit > static_cast<int64_t>(total_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--memory-limit: %.0f MiB is outside 1 MiB .. the device's %.0f MiB",
                        MiB(limit), MiB(static_cast<int64_t>(total_bytes))));
  }
  // A fraction of the device's total (setMemoryFraction), so that what the run holds is what the
  // plan said; at the cap the allocator frees its cached blocks (on a device synchronisation) and
  // retries before it fails.
  c10::cuda::CUDACachingAllocator::setMemoryFraction(
      static_cast<double>(limit) / static_cast<double>(total_bytes), CudaIndex(device));
  std::printf("allocator limit: %.0f MiB reserved%s\n", MiB(limit),
              config.memory_limit_bytes < 0 ? " (the plan's predicted reserved peak)" : "");
  return absl::OkStatus();
}

}  // namespace memplan
