// SecondsSince: wall seconds on the steady clock since a point taken from it — the agent's one
// spelling of a stage's or a measurement's duration.
#pragma once

#include <chrono>

namespace memplan {

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace memplan
