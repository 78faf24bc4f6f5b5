#include "common/fixed_knobs.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace memplan {
namespace {

template <typename T>
std::string Text(const std::optional<T>& v) {
  return absl::StrCat(*v);
}
std::string Text(const std::optional<HostMemoryKind>& v) {
  return std::string(HostMemoryKindName(*v));
}
std::string Text(const std::optional<bool>& v) { return *v ? "true" : "false"; }

// One entry per member; the lambdas need a member pointer known at compile time.
#define MEMPLAN_FIXED_KNOB(member, flag, relaxed)                                   \
  FixedKnobEntry {                                                                  \
#member, flag, relaxed, [](const FixedKnobs& f) { return f.member.has_value(); }, \
        [](FixedKnobs* f) { f->member.reset(); },                                    \
        [](const FixedKnobs& f) { return Text(f.member); } \
  }

const FixedKnobEntry kTable[] = {
    MEMPLAN_FIXED_KNOB(chunk_bytes, "--chunk-mib", true),
    MEMPLAN_FIXED_KNOB(n_persist, "--n-persist", true),
    MEMPLAN_FIXED_KNOB(n_buffer, "--n-buffer", true),
    MEMPLAN_FIXED_KNOB(n_swap, "--n-swap", true),
    MEMPLAN_FIXED_KNOB(n_checkpoint, "--n-ckpt", true),
    MEMPLAN_FIXED_KNOB(n_hs_offload, "--n-hs-offload", true),
    MEMPLAN_FIXED_KNOB(host_memory, "--host-memory", true),
    MEMPLAN_FIXED_KNOB(shard_persistent_state, "--persistent-state", false),
    MEMPLAN_FIXED_KNOB(shard_persistent_params, "--persistent-params", false),
    MEMPLAN_FIXED_KNOB(head_chunk_logit_bytes, "--head-chunk-mib", true),
};

#undef MEMPLAN_FIXED_KNOB

}  // namespace

absl::Span<const FixedKnobEntry> FixedKnobTable() { return kTable; }

std::string FixedKnobText(const FixedKnobEntry& entry, const FixedKnobs& knobs,
                          absl::string_view prefix) {
  return absl::StrCat(prefix, entry.field, " = ", entry.value_text(knobs));
}

bool AnyFixedKnob(const FixedKnobs& knobs) {
  for (const FixedKnobEntry& e : kTable) {
    if (e.is_set(knobs)) return true;
  }
  return false;
}

}  // namespace memplan
