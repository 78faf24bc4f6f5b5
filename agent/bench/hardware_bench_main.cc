// memplan-hw-bench: runs the hardware benchmark, prints the table and writes the profile as JSON
// (agent/client/record_json.h); with --planner, submits it and prints the profile id.
// Usage: memplan-hw-bench [--out FILE] [--name NAME] [--device N] [--planner ADDR]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/bench/hardware_bench.h"
#include "agent/client/planner_client.h"
#include "agent/client/record_json.h"

int main(int argc, char** argv) {
  memplan::HardwareBenchOptions options;
  std::string out, planner;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--out" && has_value) {
      out = argv[++i];
    } else if (arg == "--name" && has_value) {
      options.name = argv[++i];
    } else if (arg == "--planner" && has_value) {
      planner = argv[++i];
    } else if (arg == "--device" && has_value) {
      options.device_index = std::atoi(argv[++i]);
    } else {
      std::fprintf(
          stderr,
          "usage: memplan-hw-bench [--out FILE] [--name NAME] [--device N] [--planner ADDR]\n");
      return 2;
    }
  }
  options.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  const memplan::HardwareBenchResult result = memplan::MeasureHardware(options);
  std::printf("%s", memplan::FormatBenchTable(result).c_str());
  if (!out.empty()) {
    const absl::Status s = memplan::WriteTextFile(out, memplan::HardwareSpecToJson(result.spec));
    if (!s.ok()) {
      std::fprintf(stderr, "memplan-hw-bench: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  if (!result.gpu_status.ok()) return 3;
  if (!planner.empty()) {
    auto client = memplan::PlannerClient::Create(planner, memplan::PlannerClientOptions{});
    absl::StatusOr<std::string> id =
        client.ok() ? (*client)->SubmitHardwareProfile(result.spec) : client.status();
    if (!id.ok()) {
      std::fprintf(stderr, "memplan-hw-bench: %s\n", id.status().ToString().c_str());
      return 1;
    }
    std::printf("profile_id %s\n", id->c_str());
  }
  return 0;
}
