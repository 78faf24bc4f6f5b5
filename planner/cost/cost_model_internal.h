// Private to planner/cost: the integer names of the block modes the cost model's tables are
// indexed by, shared by its construction (cost_model.cc), memory (cost_memory.cc) and time
// (cost_time.cc) parts.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace memplan::cost_internal {

constexpr int kNoneMode = static_cast<int>(BlockMode::kNone);
constexpr int kCkptMode = static_cast<int>(BlockMode::kCkpt);
constexpr int kSwapMode = static_cast<int>(BlockMode::kSwap);
constexpr int kHsMode = static_cast<int>(BlockMode::kHsOffload);

inline int FloorLog2(int32_t x) { return 31 - __builtin_clz(static_cast<unsigned>(x)); }

}  // namespace memplan::cost_internal
