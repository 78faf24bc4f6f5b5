// `memplan-agent bench`: the hardware benchmark (agent/bench) as a subcommand, the same flags and
// output as memplan-hw-bench. Torch-free header; returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace memplan {

// 0 on success, 1 on an I/O or planner error, 2 on bad flags, 3 when the GPU part could not be
// measured (the host figures are still printed and written).
int RunBenchCommand(const std::vector<std::string>& args);

}  // namespace memplan
