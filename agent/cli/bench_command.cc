#include "agent/cli/bench_command.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "agent/bench/hardware_bench.h"
#include "agent/client/planner_client.h"
#include "agent/client/record_json.h"

namespace memplan {
namespace {

constexpr char kBenchUsage[] =
    "usage: memplan-agent bench [--out FILE] [--name NAME] [--device N] [--planner ADDR]\n";

}  // namespace

int RunBenchCommand(const std::vector<std::string>& args) {
  HardwareBenchOptions options;
  std::string out, planner;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kBenchUsage, stdout);
      return 0;
    }
    const bool has_value = i + 1 < args.size();
    if (arg == "--out" && has_value) {
      out = args[++i];
    } else if (arg == "--name" && has_value) {
      options.name = args[++i];
    } else if (arg == "--planner" && has_value) {
      planner = args[++i];
    } else if (arg == "--device" && has_value &&
               absl::SimpleAtoi(args[i + 1], &options.device_index)) {
      ++i;
    } else {
      std::fprintf(stderr, "memplan-agent bench: bad flag \"%s\"\n%s", arg.c_str(), kBenchUsage);
      return 2;
    }
  }
  options.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  const HardwareBenchResult result = MeasureHardware(options);
  std::printf("%s", FormatBenchTable(result).c_str());
  if (!out.empty()) {
    const absl::Status s = WriteTextFile(out, HardwareSpecToJson(result.spec));
    if (!s.ok()) {
      std::fprintf(stderr, "memplan-agent bench: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("profile written to %s\n", out.c_str());
  }
  if (!result.gpu_status.ok()) {
    // Without the GPU figures the planner would refuse the profile; say so instead of submitting.
    std::fprintf(stderr, "memplan-agent bench: GPU not measured: %s\n",
                 result.gpu_status.ToString().c_str());
    return 3;
  }
  if (!planner.empty()) {
    auto client = PlannerClient::Create(planner, PlannerClientOptions{});
    absl::StatusOr<std::string> id =
        client.ok() ? (*client)->SubmitHardwareProfile(result.spec) : client.status();
    if (!id.ok()) {
      std::fprintf(stderr, "memplan-agent bench: %s\n", id.status().ToString().c_str());
      return 1;
    }
    std::printf("profile_id %s\n", id->c_str());
  }
  return 0;
}

}  // namespace memplan
