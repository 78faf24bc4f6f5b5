// `memplan-agent bench`: runs the hardware benchmark (agent/bench), prints the table, writes and/or
// submits the profile. Torch-free header; returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace memplan {

// 0 on success, 1 on an I/O or planner error, 2 on bad flags, 3 when the GPU part could not be
// measured (the host figures are still printed and written), 4 when world size > 1 and a
// collective was not measured or returned wrong data. The environment (torchrun's RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) is read here, where a flag is absent.
int RunBenchCommand(const std::vector<std::string>& args);

}  // namespace memplan
