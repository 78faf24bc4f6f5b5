#include "common/safety_margin.h"

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

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
  double margin = 0;
  if (!absl::SimpleAtod(text, &margin)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = ", text, ": not a number; ", AllowedRange()));
  }
  RETURN_IF_ERROR(CheckSafetyMargin(flag, margin));
  return margin;
}

}  // namespace memplan
