#include "agent/dist/dist_options.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {
namespace {

absl::Status IntInRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " is out of range [", lo, ", ", hi, "]"));
}

// The integer value of `name` in [lo, hi], or nullopt when it is not set.
absl::StatusOr<std::optional<int>> EnvInt(const EnvLookup& env, const DistSettingLabel& label,
                                          const std::string& name, int lo, int hi,
                                          absl::string_view context = "") {
  std::optional<std::string> text = env(name);
  if (!text.has_value()) return std::optional<int>();
  // The flags that stand in for a variable (agent/bench/collective_flags.h) and the variables
  // themselves read alike: [Flag errors] of common/flags.h.
  absl::StatusOr<int64_t> v = ParseIntValue(*text, lo, hi);
  if (!v.ok()) return FlagError(label(name), absl::StrCat(v.status().message(), context));
  return std::optional<int>(static_cast<int>(*v));
}

}  // namespace

absl::string_view DistBackendName(DistBackend backend) {
  switch (backend) {
    case DistBackend::kNccl:
      return "nccl";
    case DistBackend::kGloo:
      return "gloo";
    case DistBackend::kAuto:
      break;
  }
  return "auto";
}

absl::Status ValidateDistOptions(const DistOptions& o) {
  RETURN_IF_ERROR(IntInRange("world_size", o.world_size, 1, kMaxDistWorldSize));
  RETURN_IF_ERROR(IntInRange("rank", o.rank, 0, o.world_size - 1));
  RETURN_IF_ERROR(IntInRange("local_world_size", o.local_world_size, 1, o.world_size));
  RETURN_IF_ERROR(IntInRange("local_rank", o.local_rank, 0, 1023));
  RETURN_IF_ERROR(IntInRange("master_port", o.master_port, 1, 65535));
  if (o.master_addr.empty()) return absl::InvalidArgumentError("master_addr is empty");
  RETURN_IF_ERROR(IntInRange("timeout_seconds", o.timeout_seconds, 1, 86400));
  RETURN_IF_ERROR(IntInRange("heartbeat_milliseconds", o.heartbeat_milliseconds, 10, 60000));
  return absl::OkStatus();
}

absl::StatusOr<DistOptions> DistOptionsFromEnvironment(const EnvLookup& env) {
  return DistOptionsFromSettings(
      env, [](const std::string& variable) { return variable + " (environment)"; });
}

absl::StatusOr<DistOptions> DistOptionsFromSettings(const EnvLookup& env,
                                                    const DistSettingLabel& label) {
  DistOptions o;
  ASSIGN_OR_RETURN(std::optional<int> world,
                   EnvInt(env, label, "WORLD_SIZE", 1, kMaxDistWorldSize));
  o.world_size = world.value_or(1);
  const std::string in_world = absl::StrCat(" (world size ", o.world_size, ")");
  ASSIGN_OR_RETURN(std::optional<int> rank,
                   EnvInt(env, label, "RANK", 0, o.world_size - 1, in_world));
  if (!rank.has_value() && o.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(label("RANK"), " is required with world size ",
                                                   o.world_size, ": an integer in [0, ",
                                                   o.world_size - 1, "]"));
  }
  o.rank = rank.value_or(0);
  ASSIGN_OR_RETURN(std::optional<int> local_world,
                   EnvInt(env, label, "LOCAL_WORLD_SIZE", 1, o.world_size, in_world));
  o.local_world_size = local_world.value_or(o.world_size);
  ASSIGN_OR_RETURN(std::optional<int> local_rank,
                   EnvInt(env, label, "LOCAL_RANK", 0, o.local_world_size - 1,
                          absl::StrCat(" (local world size ", o.local_world_size, ")")));
  o.local_rank = local_rank.value_or(o.rank % o.local_world_size);
  if (std::optional<std::string> addr = env("MASTER_ADDR"); addr.has_value()) {
    o.master_addr = std::string(absl::StripAsciiWhitespace(*addr));
    if (o.master_addr.empty()) {
      return FlagError(label("MASTER_ADDR"),
                       absl::StrCat(Quote(*addr), " is not a host name or address"));
    }
  }
  ASSIGN_OR_RETURN(std::optional<int> port, EnvInt(env, label, "MASTER_PORT", 1, 65535));
  o.master_port = port.value_or(o.master_port);
  if (std::optional<std::string> agent = env("TORCHELASTIC_USE_AGENT_STORE"); agent.has_value()) {
    o.store_already_served = absl::StripAsciiWhitespace(*agent) == "True";
  }
  ASSIGN_OR_RETURN(std::optional<int> high, EnvInt(env, label, "MEMPLAN_NCCL_HIGH_PRIORITY", 0, 1));
  o.high_priority_streams = high.value_or(1) == 1;
  ASSIGN_OR_RETURN(std::optional<int> coalesce,
                   EnvInt(env, label, "MEMPLAN_COALESCE_GATHERS", 0, 1));
  o.coalesce_gathers = coalesce.value_or(1) == 1;
  return o;
}

}  // namespace memplan
