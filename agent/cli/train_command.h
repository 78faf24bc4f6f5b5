// `memplan-agent train`: builds the model (preset or Hugging Face checkpoint), the data stream,
// the residency plan (flags, plan file, or the planner with --planner) and the Trainer, then
// trains and checkpoints; with --planner it also reports the measurement back (closing the loop).
// Torch-free header so main.cc stays a thin, fast-compiling file.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/dist/dist_options.h"
#include "agent/train/train_config.h"
#include "common/channel_security.h"

namespace memplan {

// The planner flags of `memplan-agent train` (agent/cli owns them; TrainConfig stays offline).
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

// Trains as `config` says. With `loop.address` set, the plan comes from the planner (a plan file
// or plan flags are then refused), and the steady-state measurement is reported to it. With
// dist.world_size > 1 (torchrun's variables, DistOptionsFromEnvironment) this process is one rank:
// it joins the process group, reads its own rows of every global batch, shards the chunks over
// the ranks, and only rank 0 logs steps and talks to the planner.
absl::Status RunTrain(const TrainConfig& config, const PlannerLoopOptions& loop = {},
                      const DistOptions& dist = {});

}  // namespace memplan
