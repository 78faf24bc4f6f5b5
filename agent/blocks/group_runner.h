// RunGroup: runs one parameter group (embedding, a transformer block, or the head) inside its own
// autograd Function so that ParamResidency hooks bracket its forward and its backward, and applies
// the block activation mode (NONE, CKPT, SWAP, HS_OFFLOAD). See docs/agent.md, "Block modes".
#pragma once

#include <functional>

#include "agent/blocks/activation_offloader.h"
#include "agent/core/torch_pch.h"
#include "agent/core/param_residency.h"
#include "common/types.h"

namespace memplan {

struct GroupSpec {
  int group = 0;  // ParamResidency group index
  BlockMode mode = BlockMode::kNone;
  // The group's computation. Called once in forward, and again in backward for CKPT/HS_OFFLOAD
  // (with the forward's RNG state restored). Must be a pure function of its input and the
  // group's parameters.
  std::function<torch::Tensor(const torch::Tensor& input)> body;
  // Optional: called in backward after PreBackward (before any recompute), and after the group's
  // inner backward (before PostBackward).
  std::function<void()> before_backward;
  std::function<void()> after_backward;
};

struct GroupRunnerOptions {
  ParamResidency* residency = nullptr;       // may be null (no parameter management)
  ActivationOffloader* offloader = nullptr;  // required for SWAP and HS_OFFLOAD
};

// Runs `spec.body(input)` as one autograd node. The input's gradient (if it requires grad) is
// the inner graph's; parameter gradients are accumulated into .grad inside the node's backward,
// so all of them are final when PostBackward(spec.group) is called. If `input` does not require
// grad (token ids), the node is still recorded so that its backward runs.
torch::Tensor RunGroup(const GroupSpec& spec, const torch::Tensor& input,
                       const GroupRunnerOptions& options);

}  // namespace memplan
