// The ratio the memory suites judge the planner's bytes by: predicted over what the agent's
// allocations measured.
#pragma once

#include <cstdint>

namespace memplan {

inline double MemoryRatio(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted) / static_cast<double>(measured);
}

}  // namespace memplan
