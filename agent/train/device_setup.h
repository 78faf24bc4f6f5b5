// The device of a training run and its caching allocator: which device the flags name, the
// allocator's settings and reserved-bytes cap, and the memory line printed after each setup stage.
// Called by TrainSession only; one call each per run, from the main thread.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/client/plan_answer.h"
#include "agent/core/torch_pch.h"
#include "agent/train/train_config.h"

namespace memplan {

// --device: "auto" is CUDA when available, else the CPU. INVALID_ARGUMENT for a name LibTorch
// does not parse, FAILED_PRECONDITION for CUDA without CUDA.
absl::StatusOr<torch::Device> ResolveDevice(const std::string& name);

// Applies --allocator-conf (PYTORCH_CUDA_ALLOC_CONF syntax; TrainConfig::allocator_conf says which
// setting wins) and starts the CUDA context and the allocator; logs the settings. No-op on CPU.
void ConfigureAllocator(const TrainConfig& config, const torch::Device& device);

// --memory-limit: caps the allocator's reserved bytes at the given size or, for "plan", at the
// planner's predicted reserved peak (`answer`, null without --planner: INVALID_ARGUMENT). Call
// once the plan is known, before the model reaches the device. Ignored (with a note) on CPU.
absl::Status ApplyMemoryLimit(const TrainConfig& config, const torch::Device& device,
                              const PlanAnswer* answer);

// "device memory <stage>: allocated ... reserved ... device used ..." (CUDA only).
void PrintDeviceMemory(const torch::Device& device, const char* stage);

}  // namespace memplan
