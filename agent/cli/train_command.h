// `memplan-agent train`: parses the run's flags (agent/train's TrainConfig, agent/client's planner
// flags) and torchrun's variables, then runs one TrainSession (agent/train/train_session.h).
// Torch-free header so main.cc stays a thin, fast-compiling file.
#pragma once

#include <string>
#include <vector>

#include "agent/dist/dist_options.h"

namespace memplan {

// `args` are the arguments after `train`; `env` looks up torchrun's variables (WORLD_SIZE, RANK,
// ...: DistOptionsFromEnvironment), read by main. Returns the exit code: 0 on success or --help,
// 1 when the run fails, 2 on bad flags or variables; the reason goes to stderr.
int RunTrainCommand(std::vector<std::string> args, const EnvLookup& env);

}  // namespace memplan
