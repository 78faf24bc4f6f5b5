#include "agent/client/planner_flags.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/request_flags.h"
#include "common/safety_margin.h"
#include "common/status.h"

namespace memplan {
namespace {

constexpr char kDefaultHardwarePreset[] = "h100-80gb";

}  // namespace

absl::StatusOr<PlannerLoopOptions> TakePlannerFlags(std::vector<std::string>* args) {
  PlannerLoopOptions loop;
  RETURN_IF_ERROR(TakeChannelSecurityFlags(args, &loop.security));
  // The planner-loop flags are taken out of the train command's arguments; the rest stays for
  // ParseTrainArgs, in order.
  FlagSet flags;
  flags.String("--planner", &loop.address)
      .String("--hardware", &loop.hardware_preset)
      .String("--hardware-profile-id", &loop.hardware_profile_id)
      .Switch("--profile", &loop.profile)
      .Int("--planner-retries", &loop.retries, 0, 100)
      .Double(kSafetyMarginFlag, &loop.safety_margin);
  RETURN_IF_ERROR(flags.Take(args));
  const bool hardware_given = flags.Given("--hardware") || flags.Given("--hardware-profile-id");
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
