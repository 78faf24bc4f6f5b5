#include "agent/cli/train_command.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agent/client/planner_flags.h"
#include "agent/train/train_config.h"
#include "agent/train/train_session.h"

namespace memplan {

int RunTrainCommand(std::vector<std::string> args, const EnvLookup& env) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(TrainUsage().c_str(), stdout);
      std::fputs(PlannerFlagsUsage().c_str(), stdout);
      return 0;
    }
  }
  auto loop = TakePlannerFlags(&args);
  if (!loop.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n", std::string(loop.status().message()).c_str());
    return 2;
  }
  auto config = ParseTrainArgs(args);
  if (!config.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  // [LoRA resume settings] A LoRA checkpoint supplies what its flags leave out.
  if (absl::Status s = AdoptResumedLora(&*config); !s.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // torchrun / Slurm / Kubernetes: one process per rank (agent/dist/dist_options.h).
  auto dist = DistOptionsFromEnvironment(env);
  if (!dist.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n", std::string(dist.status().message()).c_str());
    return 2;
  }
  // Scoped: everything the run built (process group, trainer, model) is released before the
  // outcome is printed.
  absl::Status status;
  int stop_signal = 0;
  {
    TrainSession session(*std::move(config), *std::move(loop), *dist);
    status = session.Run();
    stop_signal = session.stopped_by_signal();
  }
  if (!status.ok()) {
    if (dist->world_size > 1) {
      std::fprintf(stderr, "memplan-agent train: rank %d: %s\n", dist->rank,
                   status.ToString().c_str());
    } else {
      std::fprintf(stderr, "memplan-agent train: %s\n", status.ToString().c_str());
    }
    return 1;
  }
  // [Stopping on a signal] A clean early end is neither success (the steps were not all run) nor
  // failure (the checkpoint, with --save, is whole).
  if (stop_signal != 0) return kTrainStoppedBySignalExitCode;
  return 0;
}

}  // namespace memplan
