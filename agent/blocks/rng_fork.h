// RngFork: replays the random numbers an earlier forward drew (LoRA dropout), for code that
// recomputes that forward in backward — agent/blocks' CKPT/HS_OFFLOAD groups and agent/model's
// sequence-tiled MLP — without disturbing the generators for whatever runs after it.
#pragma once

#include "agent/core/torch_pch.h"

namespace memplan {

// RNG state of the CPU generator and, for a CUDA device, of that device's generator.
struct RngState {
  torch::Tensor cpu;
  torch::Tensor cuda;
  torch::Device device = torch::kCPU;
};

RngState CaptureRng(torch::Device device);
void RestoreRng(const RngState& state);

// Swaps `forward_state` in for its lifetime and puts the state it found back when destroyed.
class RngFork {
 public:
  explicit RngFork(const RngState& forward_state);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngState outside_;
};

}  // namespace memplan
