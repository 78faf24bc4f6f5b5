#include "agent/bench/collective_flags.h"

#include <cstdint>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "common/validate.h"

namespace memplan {
namespace {

// Where a setting came from: a flag or, when the flag is absent, its environment variable.
struct Source {
  std::string label;  // "--rank" or "RANK (environment)"
  std::string value;
};

class Settings {
 public:
  Settings(std::map<std::string, std::string> flags, const EnvLookup& env)
      : flags_(std::move(flags)), env_(env) {}

  std::optional<Source> Get(const std::string& flag, const char* env_name = nullptr) const {
    if (auto it = flags_.find(flag); it != flags_.end()) return Source{flag, it->second};
    if (env_name != nullptr && env_) {
      if (std::optional<std::string> v = env_(env_name); v.has_value()) {
        return Source{absl::StrCat(env_name, " (environment)"), *v};
      }
    }
    return std::nullopt;
  }

 private:
  std::map<std::string, std::string> flags_;
  const EnvLookup& env_;
};

// [Flag errors] of common/flags.h, named by where the value came from.
absl::Status BadValue(const Source& s, absl::string_view problem) {
  return FlagError(s.label, problem);
}

absl::StatusOr<int64_t> IntIn(const Source& s, int64_t lo, int64_t hi,
                              absl::string_view context = "") {
  absl::StatusOr<int64_t> v = ParseIntValue(s.value, lo, hi);
  if (!v.ok()) return BadValue(s, absl::StrCat(v.status().message(), context));
  return v;
}

// "4096", "64K", "256M", "1G" (also "KiB", "MiB", "GiB"): binary multiples.
std::optional<int64_t> ParseBytes(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int64_t scale = 1;
  for (const auto& [suffix, factor] :
       {std::pair<absl::string_view, int64_t>{"KiB", int64_t{1} << 10},
        {"MiB", int64_t{1} << 20},
        {"GiB", int64_t{1} << 30},
        {"K", int64_t{1} << 10},
        {"M", int64_t{1} << 20},
        {"G", int64_t{1} << 30}}) {
    if (absl::EndsWith(text, suffix)) {
      text.remove_suffix(suffix.size());
      scale = factor;
      break;
    }
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 0 || n > std::numeric_limits<int64_t>::max() / scale) {
    return std::nullopt;
  }
  return n * scale;
}

}  // namespace

absl::StatusOr<CollectiveFlags> TakeCollectiveFlags(std::vector<std::string>* args,
                                                    const EnvLookup& env) {
  // Only the text here: a flag's value is checked with its environment variable's rules below.
  std::map<std::string, std::optional<std::string>> values;
  FlagSet flags;
  for (const char* name :
       {"--world-size", "--rank", "--master-addr", "--master-port", "--collective-backend",
        "--collective-bytes", "--collective-repetitions", "--collective-timeout"}) {
    flags.String(name, &values[name]);
  }
  std::vector<std::string> rest = *args;
  if (absl::Status s = flags.Take(&rest); !s.ok()) return s;
  std::map<std::string, std::string> given;
  for (const auto& [name, value] : values) {
    if (value.has_value()) given[name] = *value;
  }
  // torchrun's variables with the flags standing in for them, through agent/dist's one parser.
  static const std::map<std::string, std::string> kFlagOf = {{"WORLD_SIZE", "--world-size"},
                                                             {"RANK", "--rank"},
                                                             {"MASTER_ADDR", "--master-addr"},
                                                             {"MASTER_PORT", "--master-port"}};
  auto flag_value = [&given](const std::string& variable) -> const std::string* {
    const auto flag = kFlagOf.find(variable);
    if (flag == kFlagOf.end()) return nullptr;
    const auto it = given.find(flag->second);
    return it == given.end() ? nullptr : &it->second;
  };
  const EnvLookup lookup = [&](const std::string& variable) -> std::optional<std::string> {
    if (const std::string* v = flag_value(variable)) return *v;
    return env ? env(variable) : std::nullopt;
  };
  const DistSettingLabel label = [&](const std::string& variable) -> std::string {
    if (flag_value(variable) != nullptr) return kFlagOf.at(variable);
    const auto flag = kFlagOf.find(variable);
    if ((env && env(variable).has_value()) || flag == kFlagOf.end()) {
      return absl::StrCat(variable, " (environment)");
    }
    return absl::StrCat(flag->second, " (or ", variable, ")");  // missing: either would do
  };
  absl::StatusOr<DistOptions> dist = DistOptionsFromSettings(lookup, label);
  if (!dist.ok()) return dist.status();
  const Settings settings(std::move(given), env);

  CollectiveFlags out;
  CollectiveBenchOptions& o = out.options;
  o.world_size = dist->world_size;
  o.rank = dist->rank;
  o.master_addr = dist->master_addr;
  o.master_port = dist->master_port;
  // torchrun serves the store itself unless told not to share it; then every rank is a client.
  o.store_already_served = dist->store_already_served;
  if (lookup("LOCAL_RANK").has_value()) out.local_rank = dist->local_rank;
  if (auto s = settings.Get("--collective-backend")) {
    const std::string b = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s->value));
    if (b == "nccl") {
      o.backend = CollectiveBackend::kNccl;
    } else if (b == "gloo") {
      o.backend = CollectiveBackend::kGloo;
    } else {
      return BadValue(*s, NotOneOf(s->value, "nccl, gloo"));
    }
  }
  if (auto s = settings.Get("--collective-bytes")) {
    const int64_t lo = int64_t{4} * o.world_size;
    std::optional<int64_t> bytes = ParseBytes(s->value);
    if (!bytes.has_value()) {
      return BadValue(
          *s, absl::StrCat(Quote(s->value), " is not a byte count in ",
                           RangeText(lo, kMaxCollectiveMessageBytes), " (suffixes K, M, G)"));
    }
    if (*bytes < lo || *bytes > kMaxCollectiveMessageBytes) {
      return BadValue(
          *s, absl::StrCat(*bytes, " is outside ", RangeText(lo, kMaxCollectiveMessageBytes),
                           " (4 bytes per rank at least; world size ", o.world_size, ")"));
    }
    o.message_bytes = *bytes;
  }
  if (auto s = settings.Get("--collective-repetitions")) {
    auto v = IntIn(*s, 1, 1000);
    if (!v.ok()) return v.status();
    o.repetitions = static_cast<int>(*v);
  }
  if (auto s = settings.Get("--collective-timeout")) {
    auto v = IntIn(*s, 1, 86400, " seconds");
    if (!v.ok()) return v.status();
    o.timeout_seconds = static_cast<int>(*v);
  }
  *args = std::move(rest);
  return out;
}

std::string CollectiveFlagsUsage() {
  return absl::StrCat(R"(
multi-process flags (world size > 1: each rank runs this command at the same time; torchrun's
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK are read when a flag is absent):
  --world-size N              number of ranks, 1 to )",
                      kMaxCollectiveWorldSize, R"( (default 1: no collectives)
  --rank R                    this process's rank, 0 to N-1 (required when N > 1)
  --master-addr HOST          where rank 0 serves the c10d TCP store (default 127.0.0.1)
  --master-port P             its port, 1 to 65535 (default 29500)
  --collective-backend B      nccl (CUDA, bf16; the default with a CUDA device) or gloo (CPU,
                              fp32; the default without one)
  --collective-bytes BYTES    the all-gather's total output = the reduce-scatter's total input
                              (default: 256 MiB, the transfer size); suffixes K, M, G
  --collective-repetitions N  timed runs of 5 back-to-back ops, 1 to 1000 (default 10); the
                              figure is the median run of the slowest rank
  --collective-timeout S      seconds allowed for joining and for each collective (default 600)
  LOCAL_RANK                  this rank's CUDA device when --device is absent
)");
}

}  // namespace memplan
