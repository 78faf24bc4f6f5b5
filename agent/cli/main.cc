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
#include "agent/cli/version_text.h"
#include "common/flags.h"

namespace {

constexpr char kUsage[] = R"(usage: memplan-agent <command> [flags]

commands:
  train    train a Llama-family model under a residency plan; with --planner ADDR the plan
           comes from the planner and the measurement goes back to it (memplan-agent train --help)
  profile  profile a preset model at a workload and write/submit the trace
  bench    benchmark this host's GPU and CPU and write/submit the hardware profile
  export   rewrite a checkpoint (per-rank ones included) as one Hugging Face-loadable directory

  --version  the build, and the torch, CUDA runtime, cuDNN and NCCL versions it runs with
)";

// The environment is read here only: torchrun's variables reach the train command through this.
std::optional<std::string> GetEnv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
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
  if (memplan::VersionRequested(args)) {
    std::fputs(memplan::AgentVersionText().c_str(), stdout);
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "train") return memplan::RunTrainCommand(std::move(args), GetEnv);
  if (command == "profile") return memplan::RunProfileCommand(args);
  if (command == "bench") return memplan::RunBenchCommand(args);
  if (command == "export") return memplan::RunExportCommand(args);
  std::fprintf(stderr, "memplan-agent: unknown command \"%s\"\n%s", command.c_str(), kUsage);
  return 2;
}
