// [Host reserve] How much of a node's RAM is not a plan's: the one definition the planner limits
// its host bytes by (planner/core/plan_engine.cc) and the agent checks its pinned activation
// copies against ([Pinned copies by the plan's room], agent/train/pinned_activations.h).
// Header-only, pure.
//
// The operating system, the page cache and the node's other processes keep 8 % of the RAM (at
// least 4 GiB), and every agent process needs its own runtime beside its chunks and activation
// copies: 4 GiB per local rank.
// Measured on the GPU hosts: 0.5-0.9 GB resident before the model (Torch, CUDA, NCCL); beyond the
// plan's host bytes up to 4.2 GiB at a load's peak (a QLoRA base quantized from bf16 reads, before
// any activation copy exists) and 3.0 GiB in training; 3.9 GB beyond them in the first step of a
// qwen3-8b QLoRA plan with 101 GiB of pinned activation copies, which a 3 GiB share left
// SIGKILLed on a 126 GiB host (`free`: 0.8 GB available), where the rest of the host held about
// 8 GB (6 % of it; 5 % were held back then). A plan that filled the RAM exactly got its ranks
// OOM-killed while loading (docs/benchmarks.md, qwen2.5-32b on 4 H200s); on the same 126 GiB host
// swap-heavy plans of 110-115 GiB were killed or stalled in their first step (twenty-fourth and
// twenty-fifth sessions) with torch's caching host allocator, which [Pinned copies by the plan's
// room] now leaves where it may not fit.
#pragma once

#include <algorithm>
#include <cstdint>

namespace memplan {

inline constexpr int64_t kHostRuntimeBytesPerRank = int64_t{4} << 30;

// The bytes of a node with `host_memory_bytes` of RAM held back from a plan of `local_ranks`
// ranks on it (at least one).
inline int64_t HostReserveBytes(int64_t host_memory_bytes, int32_t local_ranks) {
  return std::max<int64_t>(host_memory_bytes / 25 * 2, int64_t{4} << 30) +
         kHostRuntimeBytesPerRank * std::max<int32_t>(local_ranks, 1);
}

// The node's RAM a plan of `local_ranks` ranks may use, all ranks together: what is left after
// the reserve (0 when the reserve takes it all).
inline int64_t PlanHostBytes(int64_t host_memory_bytes, int32_t local_ranks) {
  return std::max<int64_t>(host_memory_bytes - HostReserveBytes(host_memory_bytes, local_ranks), 0);
}

}  // namespace memplan
