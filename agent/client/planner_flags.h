// The planner flags of `memplan-agent train` (--planner, --hardware, --profile, ...): how one run
// reaches the planner. Torch-free and gRPC-free, so main.cc and the flag tests stay light.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/channel_security.h"

namespace memplan {

// Where the plan comes from and how the planner is reached. A plain value type.
struct PlannerLoopOptions {
  std::string address;              // --planner ADDR; empty: offline (flags / --plan-file)
  std::string hardware_preset;      // --hardware PRESET (default h100-80gb when no profile id)
  std::string hardware_profile_id;  // --hardware-profile-id ID (from `memplan-agent bench`)
  bool profile = false;             // --profile: profile the model and SubmitTrace first
  int retries = 4;                  // --planner-retries N: client retries on UNAVAILABLE
  double safety_margin = 0;         // --safety-margin F; 0: the planner's default
  ChannelSecurityOptions security;  // --tls-ca, --tls-cert, --tls-key, --auth-token-file, ...
};

// Removes the planner flags from `args` (the rest goes to ParseTrainArgs). INVALID_ARGUMENT
// names the flag; planner-only flags without --planner are rejected too.
absl::StatusOr<PlannerLoopOptions> TakePlannerFlags(std::vector<std::string>* args);
std::string PlannerFlagsUsage();

}  // namespace memplan
