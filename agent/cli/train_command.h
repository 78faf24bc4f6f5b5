// `memplan-agent train`: parses the run's flags (agent/train's TrainConfig, agent/client's planner
// flags) and torchrun's variables, then runs one TrainSession (agent/train/train_session.h).
// Torch-free header so main.cc stays a thin, fast-compiling file.
#pragma once

#include <string>
#include <vector>

#include "agent/dist/dist_options.h"

namespace memplan {

// The exit code of a run that SIGTERM or SIGINT stopped after a whole step (its checkpoint
// written when --save was given; TrainSession's [Stopping on a signal]).
inline constexpr int kTrainStoppedBySignalExitCode = 3;

// `args` are the arguments after `train`; `env` looks up torchrun's variables (WORLD_SIZE, RANK,
// ...: DistOptionsFromEnvironment), read by main. Returns the exit code: 0 on success, --help or
// nothing left to train, 1 when the run fails, 2 on bad flags or variables (the reason goes to
// stderr), kTrainStoppedBySignalExitCode (3) when a signal stopped it between steps.
int RunTrainCommand(std::vector<std::string> args, const EnvLookup& env);

}  // namespace memplan
