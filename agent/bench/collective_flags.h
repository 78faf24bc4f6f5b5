// The multi-process flags of `memplan-agent bench` and torchrun's environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, LOCAL_RANK, TORCHELASTIC_USE_AGENT_STORE) as CollectiveBenchOptions.
// The environment comes in through a lookup function: the command reads it, this code only parses.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/bench/collective_bench.h"
#include "agent/dist/dist_options.h"  // EnvLookup

namespace memplan {

struct CollectiveFlags {
  CollectiveBenchOptions options;
  std::optional<int> local_rank;  // LOCAL_RANK: this rank's CUDA device when --device is absent
};

// Takes the collective flags (--world-size, --rank, --master-addr, --master-port,
// --collective-backend, --collective-bytes, --collective-repetitions, --collective-timeout; as
// "--flag VALUE" or "--flag=VALUE") out of *args, leaving the others in order. A flag wins over
// its environment variable. INVALID_ARGUMENT names the flag (or variable), its allowed range and
// the value given.
absl::StatusOr<CollectiveFlags> TakeCollectiveFlags(std::vector<std::string>* args,
                                                    const EnvLookup& env);

// The --help text of those flags.
std::string CollectiveFlagsUsage();

}  // namespace memplan
