// memplan-agent: the per-GPU runtime. `memplan-agent <command> --help` lists each command's flags.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "agent/cli/bench_command.h"
#include "agent/cli/export_command.h"
#include "agent/cli/profile_command.h"
#include "agent/cli/train_command.h"
#include "agent/train/train_config.h"

namespace {

constexpr char kUsage[] = R"(usage: memplan-agent <command> [flags]

commands:
  train    train a Llama-family model under a residency plan; with --planner ADDR the plan
           comes from the planner and the measurement goes back to it (memplan-agent train --help)
  profile  profile a preset model at a workload and write/submit the trace
  bench    benchmark this host's GPU and CPU and write/submit the hardware profile
  export   rewrite a checkpoint (per-rank ones included) as one Hugging Face-loadable directory
)";

int Train(std::vector<std::string> args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(memplan::TrainUsage().c_str(), stdout);
      std::fputs(memplan::PlannerFlagsUsage().c_str(), stdout);
      return 0;
    }
  }
  auto loop = memplan::TakePlannerFlags(&args);
  if (!loop.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n", std::string(loop.status().message()).c_str());
    return 2;
  }
  auto config = memplan::ParseTrainArgs(args);
  if (!config.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  // torchrun / Slurm / Kubernetes: one process per rank (agent/dist/dist_options.h).
  auto dist = memplan::DistOptionsFromEnvironment(
      [](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      });
  if (!dist.ok()) {
    std::fprintf(stderr, "memplan-agent train: %s\n", std::string(dist.status().message()).c_str());
    return 2;
  }
  const absl::Status status = memplan::RunTrain(*config, *loop, *dist);
  if (!status.ok()) {
    if (dist->world_size > 1) {
      std::fprintf(stderr, "memplan-agent train: rank %d: %s\n", dist->rank,
                   status.ToString().c_str());
    } else {
      std::fprintf(stderr, "memplan-agent train: %s\n", status.ToString().c_str());
    }
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe, so the summary lines interleave with the stderr log in order.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // /metrics (common/metrics_server.h): a scraper that hangs up mid-answer must not end a run.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "train") return Train(std::move(args));
  if (command == "profile") return memplan::RunProfileCommand(args);
  if (command == "bench") return memplan::RunBenchCommand(args);
  if (command == "export") return memplan::RunExportCommand(args);
  std::fprintf(stderr, "memplan-agent: unknown command \"%s\"\n%s", command.c_str(), kUsage);
  return 2;
}
