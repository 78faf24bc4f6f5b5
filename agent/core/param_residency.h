// ParamResidency: the hook interface through which the model tells a parameter manager (e.g. the
// ChunkManager) when each parameter group is about to run and when it is done, in forward and
// backward. Groups are in execution order: 0 = embedding, 1..N = transformer blocks, N+1 = final
// norm + LM head.
#pragma once

#include <string>
#include <vector>

#include "agent/core/torch_pch.h"

namespace memplan {

// A trainable parameter with its Hugging Face name (e.g. "model.layers.3.mlp.up_proj.weight").
struct NamedParam {
  std::string name;
  torch::Tensor param;
};

// A flat element range of a named tensor: elements [begin, begin + values.numel()) of the
// flattened tensor. What a rank stores of a parameter or its optimizer state ([Per-rank
// checkpoints], agent/io/checkpoint.h; ChunkManager::LocalPieces).
struct TensorPiece {
  std::string name;
  int64_t begin = 0;
  torch::Tensor values;  // 1-D
};

// One list per group, in execution order. A tied LM head lists the embedding weight in the last
// group too (the same tensor object as in group 0).
using ParamGroups = std::vector<std::vector<NamedParam>>;

// Callbacks issued by the model (agent/blocks runs every group inside a custom autograd Function,
// so the order below holds in backward too). Called from the thread running forward/backward;
// implementations need not be thread-safe.
class ParamResidency {
 public:
  virtual ~ParamResidency() = default;
  // On return, every parameter of `group` holds its real values on the compute device.
  virtual void PreForward(int group) = 0;
  // The group's forward is done; its parameters may be released.
  virtual void PostForward(int group) = 0;
  // Called before the group's backward (and before its recompute for checkpointed blocks); on
  // return the parameters hold real values on the compute device.
  virtual void PreBackward(int group) = 0;
  // The group's backward is done: every parameter .grad of the group is final for this micro-batch
  // (accumulated into .grad).
  virtual void PostBackward(int group) = 0;
};

}  // namespace memplan
