// The fixed knobs, listed once: each FixedKnobs member (common/types.h) with its wire field and
// its flag in `memplan plan` and `memplan-agent train`. Code that walks the knobs (the planner's
// "which fixed knob blocks the fit", the flag lists in help and error texts) walks this table.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/types.h"

namespace memplan {

struct FixedKnobEntry {
  absl::string_view field;  // FixedKnobs member and v1::FixedKnobs field, e.g. "n_checkpoint"
  absl::string_view flag;   // e.g. "--n-ckpt"
  // The planner tries the plan without this knob when none fits with it. The sharding choices
  // change what each rank holds, not the plan shape, so they are not tried.
  bool relaxed_when_no_fit;
  bool (*is_set)(const FixedKnobs&);
  void (*clear)(FixedKnobs*);
  // The set value as text ("1048576", "pinned", "true"); requires is_set.
  std::string (*value_text)(const FixedKnobs&);
};

// Every knob, in FixedKnobs' member order.
absl::Span<const FixedKnobEntry> FixedKnobTable();

// "<prefix><field> = <value>", e.g. "fixed.n_persist = 3"; requires entry.is_set(knobs).
std::string FixedKnobText(const FixedKnobEntry& entry, const FixedKnobs& knobs,
                          absl::string_view prefix);

// True when any knob is set.
bool AnyFixedKnob(const FixedKnobs& knobs);

}  // namespace memplan
