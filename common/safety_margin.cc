#include "common/safety_margin.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/flags.h"

namespace memplan {
namespace {

std::string AllowedRange() {
  return absl::StrCat("allowed [", kMinSafetyMargin, ", ", kMaxSafetyMargin, "]");
}

}  // namespace

absl::Status CheckSafetyMargin(absl::string_view name, double margin) {
  if (std::isfinite(margin) && margin >= kMinSafetyMargin && margin <= kMaxSafetyMargin) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, " = ", margin, " is out of range; ", AllowedRange()));
}

double ResolveSafetyMargin(double requested) {
  return requested == 0 ? kDefaultSafetyMargin : requested;
}

absl::StatusOr<double> ParseSafetyMarginFlag(absl::string_view flag, absl::string_view text) {
  return ParseDoubleFlag(flag, text, DoubleRange{kMinSafetyMargin, kMaxSafetyMargin});
}

}  // namespace memplan
