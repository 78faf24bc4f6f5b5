// The safety margin: the fraction of a card's memory a plan leaves free. One rule for the Plan
// request's `safety_margin`, the planner engine (PlanInputs), `memplan --safety-margin` and
// `memplan-agent --safety-margin`.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan {

// The margin a request gets when it sets none.
inline constexpr double kDefaultSafetyMargin = 0.05;
// Allowed range [kMinSafetyMargin, kMaxSafetyMargin]; beyond half the card a plan is a guess.
inline constexpr double kMinSafetyMargin = 0.0;
inline constexpr double kMaxSafetyMargin = 0.5;

// OK when `margin` is finite and in [0, 0.5]; else INVALID_ARGUMENT
// "<name> = <margin> is out of range; allowed [0, 0.5]", where `name` is the field or flag
// ("safety_margin", "--safety-margin").
absl::Status CheckSafetyMargin(absl::string_view name, double margin);

// The margin a Plan request means: proto3 cannot tell an unset double from 0, so 0 reads as
// kDefaultSafetyMargin and a client cannot ask for no margin at all. Any other value unchanged.
double ResolveSafetyMargin(double requested);

// A flag's text as a margin: a number CheckSafetyMargin accepts (0: the planner's default), else
// common/flags.h's [Flag errors], e.g. "--safety-margin: 0.9 is outside [0, 0.5]".
absl::StatusOr<double> ParseSafetyMarginFlag(absl::string_view flag, absl::string_view text);

}  // namespace memplan
