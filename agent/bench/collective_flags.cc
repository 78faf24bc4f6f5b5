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
#include "common/flag_arg.h"

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

absl::Status BadValue(const Source& s, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(s.label, " must be ", expected, "; got \"", s.value, "\""));
}

absl::StatusOr<int64_t> IntIn(const Source& s, int64_t lo, int64_t hi,
                              absl::string_view context = "") {
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(s.value), &v) || v < lo || v > hi) {
    return BadValue(s, absl::StrCat("an integer in [", lo, ", ", hi, "]", context));
  }
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

const char* const kValueFlags[] = {"--world-size",
                                   "--rank",
                                   "--master-addr",
                                   "--master-port",
                                   "--collective-backend",
                                   "--collective-bytes",
                                   "--collective-repetitions",
                                   "--collective-timeout"};

bool IsCollectiveFlag(const std::string& name) {
  for (const char* f : kValueFlags) {
    if (name == f) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<CollectiveFlags> TakeCollectiveFlags(std::vector<std::string>* args,
                                                    const EnvLookup& env) {
  std::map<std::string, std::string> given;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& arg = (*args)[i];
    auto [name, value] = SplitFlagArg(arg);
    if (!IsCollectiveFlag(name)) {
      rest.push_back(arg);
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args->size()) return absl::InvalidArgumentError(name + " needs a value");
      value = (*args)[++i];
    }
    given[name] = *value;
  }
  const Settings settings(std::move(given), env);

  CollectiveFlags out;
  CollectiveBenchOptions& o = out.options;
  if (auto s = settings.Get("--world-size", "WORLD_SIZE")) {
    auto v = IntIn(*s, 1, kMaxCollectiveWorldSize);
    if (!v.ok()) return v.status();
    o.world_size = static_cast<int>(*v);
  }
  const std::string world = absl::StrCat(" (world size ", o.world_size, ")");
  if (auto s = settings.Get("--rank", "RANK")) {
    auto v = IntIn(*s, 0, o.world_size - 1, world);
    if (!v.ok()) return v.status();
    o.rank = static_cast<int>(*v);
  } else if (o.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--rank (or RANK) is required with world size ",
                                                   o.world_size, ": an integer in [0, ",
                                                   o.world_size - 1, "]"));
  }
  if (auto s = settings.Get("--master-addr", "MASTER_ADDR")) {
    if (absl::StripAsciiWhitespace(s->value).empty()) return BadValue(*s, "a host name or address");
    o.master_addr = std::string(absl::StripAsciiWhitespace(s->value));
  }
  if (auto s = settings.Get("--master-port", "MASTER_PORT")) {
    auto v = IntIn(*s, 1, 65535);
    if (!v.ok()) return v.status();
    o.master_port = static_cast<int>(*v);
  }
  if (auto s = settings.Get("--collective-backend")) {
    const std::string b = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s->value));
    if (b == "nccl") {
      o.backend = CollectiveBackend::kNccl;
    } else if (b == "gloo") {
      o.backend = CollectiveBackend::kGloo;
    } else {
      return BadValue(*s, "nccl or gloo");
    }
  }
  if (auto s = settings.Get("--collective-bytes")) {
    const int64_t lo = int64_t{4} * o.world_size;
    std::optional<int64_t> bytes = ParseBytes(s->value);
    if (!bytes.has_value() || *bytes < lo || *bytes > kMaxCollectiveMessageBytes) {
      return BadValue(*s,
                      absl::StrCat("a byte count in [", lo, ", ", kMaxCollectiveMessageBytes,
                                   "] (4 bytes per rank at least", world, "; suffixes K, M, G)"));
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
  // torchrun serves the store itself unless told not to share it; then every rank is a client.
  if (auto s = settings.Get("", "TORCHELASTIC_USE_AGENT_STORE")) {
    o.store_already_served = absl::StripAsciiWhitespace(s->value) == "True";
  }
  if (auto s = settings.Get("", "LOCAL_RANK")) {
    auto v = IntIn(*s, 0, 1023);
    if (!v.ok()) return v.status();
    out.local_rank = static_cast<int>(*v);
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
