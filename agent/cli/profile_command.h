// `memplan-agent profile`: one profiling pass of a preset model (agent/profiler); prints the
// per-block table, writes and/or submits the trace. Torch-free header; returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace memplan {

// 0 on success, 1 on a profiling, I/O or planner error, 2 on bad flags.
int RunProfileCommand(const std::vector<std::string>& args);

}  // namespace memplan
