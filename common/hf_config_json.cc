#include "common/hf_config_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan {
namespace hf_json {

absl::Status KeyError(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" ", what));
}

const Json* Find(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& obj, const char* key, int64_t lo,
                                                   int64_t hi) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::optional<int64_t>();
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return KeyError(key, absl::StrCat("= ", u, " is out of range; allowed [", lo, ", ", hi, "]"));
    }
    value = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    value = v->get<int64_t>();
  } else {
    return KeyError(key, absl::StrCat("must be an integer, got ", v->dump()));
  }
  if (value < lo || value > hi) {
    return KeyError(key,
                    absl::StrCat("= ", value, " is out of range; allowed [", lo, ", ", hi, "]"));
  }
  return std::optional<int64_t>(value);
}

absl::StatusOr<int64_t> RequiredInt(const Json& obj, const char* key, int64_t lo, int64_t hi) {
  ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(obj, key, lo, hi));
  if (!v.has_value()) return KeyError(key, "is required");
  return *v;
}

absl::StatusOr<std::optional<double>> OptionalPositiveDouble(const Json& obj, const char* key,
                                                             double hi) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return KeyError(key, absl::StrCat("must be a number, got ", v->dump()));
  double value = v->get<double>();
  if (!std::isfinite(value) || value <= 0 || value > hi) {
    return KeyError(key, absl::StrCat("= ", value, " is out of range; allowed (0, ", hi, "]"));
  }
  return std::optional<double>(value);
}

absl::StatusOr<std::optional<bool>> OptionalBool(const Json& obj, const char* key) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean())
    return KeyError(key, absl::StrCat("must be true or false, got ", v->dump()));
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, const char* key) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return KeyError(key, absl::StrCat("must be a string, got ", v->dump()));
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::optional<double>> RopeNumber(const Json& rp, const std::string& where,
                                                 const char* key, double hi) {
  const Json* v = Find(rp, key);
  if (v == nullptr) return std::optional<double>();
  const std::string name = absl::StrCat(where, ".", key);
  if (!v->is_number()) return KeyError(name, absl::StrCat("must be a number, got ", v->dump()));
  const double value = v->get<double>();
  if (!std::isfinite(value) || value <= 0 || value > hi) {
    return KeyError(name, absl::StrCat("= ", value, " is out of range; allowed (0, ", hi, "]"));
  }
  return std::optional<double>(value);
}

absl::Status Nested(const absl::Status& status, absl::string_view prefix) {
  constexpr absl::string_view kLead = "config.json: \"";
  absl::string_view message = status.message();
  if (!absl::StartsWith(message, kLead)) return status;
  return absl::Status(status.code(), absl::StrCat(kLead, prefix, message.substr(kLead.size())));
}

}  // namespace hf_json
}  // namespace memplan
