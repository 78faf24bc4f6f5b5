#include "agent/client/planner_flags.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flag_arg.h"
#include "common/safety_margin.h"
#include "common/status.h"

namespace memplan {
namespace {

constexpr char kDefaultHardwarePreset[] = "h100-80gb";

}  // namespace

absl::StatusOr<PlannerLoopOptions> TakePlannerFlags(std::vector<std::string>* args) {
  PlannerLoopOptions loop;
  RETURN_IF_ERROR(TakeChannelSecurityFlags(args, &loop.security));
  std::vector<std::string> rest;
  bool hardware_given = false;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& arg = (*args)[i];
    auto [name, value] = SplitFlagArg(arg);
    if (name == "--profile") {
      if (value.has_value()) return absl::InvalidArgumentError("--profile takes no value");
      loop.profile = true;
      continue;
    }
    if (name != "--planner" && name != "--hardware" && name != "--hardware-profile-id" &&
        name != "--planner-retries" && name != "--safety-margin") {
      rest.push_back(arg);
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args->size()) return absl::InvalidArgumentError(name + " needs a value");
      value = (*args)[++i];
    }
    if (name == "--planner") {
      loop.address = *value;
    } else if (name == "--hardware") {
      loop.hardware_preset = *value;
      hardware_given = true;
    } else if (name == "--hardware-profile-id") {
      loop.hardware_profile_id = *value;
      hardware_given = true;
    } else if (name == "--planner-retries") {
      if (!absl::SimpleAtoi(*value, &loop.retries) || loop.retries < 0 || loop.retries > 100) {
        return absl::InvalidArgumentError("--planner-retries must be an integer in [0, 100]");
      }
    } else {
      ASSIGN_OR_RETURN(loop.safety_margin, ParseSafetyMarginFlag(name, *value));
    }
  }
  if (loop.address.empty() &&
      (hardware_given || loop.profile || HasChannelSecurity(loop.security))) {
    return absl::InvalidArgumentError(
        "--hardware, --hardware-profile-id, --profile, --tls-* and --auth-token-file need "
        "--planner ADDR");
  }
  if (!loop.hardware_preset.empty() && !loop.hardware_profile_id.empty()) {
    return absl::InvalidArgumentError("give at most one of --hardware or --hardware-profile-id");
  }
  if (!loop.address.empty() && loop.hardware_profile_id.empty() && loop.hardware_preset.empty()) {
    loop.hardware_preset = kDefaultHardwarePreset;
  }
  *args = std::move(rest);
  return loop;
}

std::string PlannerFlagsUsage() {
  return absl::StrCat(R"(
planner flags (closing the loop):
  --planner ADDR              ask the planner at ADDR for the plan, apply it, train, and report
                              the steady-state measurement; plan knob flags (--chunk-mib,
                              --n-persist, --n-buffer, --n-ckpt, --n-swap, --n-hs-offload,
                              --host-memory, --persistent-state, --persistent-params) are
                              fixed in its search
                              (--plan-file, --block-modes and --plain refused)
  --hardware PRESET           the card to plan for (default )",
                      kDefaultHardwarePreset, R"()
  --hardware-profile-id ID    a profile stored by `memplan-agent bench --planner ADDR`
  --profile                   profile the model at this workload first and plan from that trace
  --planner-retries N         retries on UNAVAILABLE with backoff (default 4)
  --safety-margin F           fraction of the card kept free, 0 to 0.5 (0 or unset: the
                              planner's default, 0.05)
)",
                      ChannelSecurityUsage());
}

}  // namespace memplan
