#include "agent/cli/bench_command.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/bench/collective_flags.h"
#include "agent/bench/hardware_bench.h"
#include "agent/client/planner_client.h"
#include "agent/client/record_json.h"
#include "common/flags.h"

namespace memplan {
namespace {

constexpr char kBenchUsage[] =
    "usage: memplan-agent bench [--out FILE] [--name NAME] [--device N] [--planner ADDR]\n"
    "                           [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]\n"
    "                           [--auth-token-file FILE]\n"
    "                           [--world-size N --rank R [--master-addr HOST] [--master-port P]\n"
    "                            [--collective-backend nccl|gloo] [--collective-bytes BYTES]\n"
    "                            [--collective-repetitions N] [--collective-timeout S]]\n";

std::string BenchUsage() {
  return absl::StrCat(kBenchUsage, R"(
  --out FILE                  write the profile as proto JSON (rank 0 only)
  --name NAME                 profile name (default: the GPU's name, or "cpu")
  --device N                  CUDA device (default: LOCAL_RANK, else 0)
  --planner ADDR              submit the profile to the planner and print its id (rank 0 only)
)",
                      ChannelSecurityUsage(), CollectiveFlagsUsage(), R"(
exit status: 0 done; 1 I/O or planner error; 2 bad flags; 3 the GPU part was not measured (no
CUDA: host figures only); 4 world size > 1 and a collective was not measured or returned wrong data
)");
}

std::optional<std::string> GetEnv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace

int RunBenchCommand(const std::vector<std::string>& args_in) {
  std::vector<std::string> args = args_in;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(BenchUsage().c_str(), stdout);
      return 0;
    }
  }
  absl::StatusOr<CollectiveFlags> collective = TakeCollectiveFlags(&args, &GetEnv);
  if (!collective.ok()) {
    std::fprintf(stderr, "memplan-agent bench: %s\n%s",
                 std::string(collective.status().message()).c_str(), kBenchUsage);
    return 2;
  }
  PlannerClientOptions client_options;
  if (absl::Status s = TakeChannelSecurityFlags(&args, &client_options.security); !s.ok()) {
    std::fprintf(stderr, "memplan-agent bench: %s\n%s", std::string(s.message()).c_str(),
                 kBenchUsage);
    return 2;
  }
  HardwareBenchOptions options;
  options.collective = collective->options;
  std::string out, planner;
  FlagSet flags;
  flags.String("--out", &out)
      .String("--name", &options.name)
      .String("--planner", &planner)
      .Int("--device", &options.device_index, 0, 1023);
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "memplan-agent bench: %s\n%s", std::string(s.message()).c_str(),
                 kBenchUsage);
    return 2;
  }
  const bool device_given = flags.Given("--device");
  if (planner.empty() && HasChannelSecurity(client_options.security)) {
    std::fprintf(stderr,
                 "memplan-agent bench: --tls-* and --auth-token-file need --planner ADDR\n");
    return 2;
  }
  if (!device_given && collective->local_rank.has_value()) {
    options.device_index = *collective->local_rank;
  }
  const int world_size = options.collective.world_size;
  const int rank = options.collective.rank;
  // Every rank measures its GPU and the collectives; one writes and submits (the ranks of a host
  // type share one profile). The CPU passes only the writer measures: they are the rate of one
  // process alone on the host, which the planner divides among a node's local ranks ([Shared host
  // CPU], planner/cost/cost_model.cc); measured by every rank at once they would be the shared
  // rate already.
  const bool writer = rank == 0;
  if (!writer) options.adam_repetitions = 0;
  options.progress = [world_size, rank](const std::string& line) {
    if (world_size > 1) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, line.c_str());
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  };
  const HardwareBenchResult result = MeasureHardware(options);
  std::printf("%s", FormatBenchTable(result).c_str());
  if (!out.empty() && writer) {
    const absl::Status s = WriteTextFile(out, HardwareSpecToJson(result.spec));
    if (!s.ok()) {
      std::fprintf(stderr, "memplan-agent bench: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("profile written to %s\n", out.c_str());
  } else if (!out.empty() || !planner.empty()) {
    std::printf("rank %d: the profile is written and submitted by rank 0\n", rank);
  }
  if (!result.collective_status.ok()) {
    std::fprintf(stderr, "memplan-agent bench: collectives not measured: %s\n",
                 result.collective_status.ToString().c_str());
    return 4;
  }
  if (!result.gpu_status.ok()) {
    // Without the GPU figures the planner would refuse the profile; say so instead of submitting.
    std::fprintf(stderr, "memplan-agent bench: GPU not measured: %s\n",
                 result.gpu_status.ToString().c_str());
    return 3;
  }
  if (!planner.empty() && writer) {
    auto client = PlannerClient::Create(planner, client_options);
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
