// Named architectures (published Hugging Face configs) and hardware (published figures).
// A measured hardware profile submitted by an agent supersedes a preset of the same name.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace memplan {

const std::vector<ModelSpec>& ModelPresets();
const std::vector<HardwareSpec>& HardwarePresets();
// The preset `name` names (MatchPresetName's rule: any case; a Hugging Face repo id such as
// "meta-llama/Llama-3.1-8B" names the preset of its last part).
std::optional<ModelSpec> FindModelPreset(std::string_view name);
std::optional<HardwareSpec> FindHardwarePreset(std::string_view name);

// How a user's spelling relates to a list of preset names: `name` is the preset it names, exactly
// or ignoring case and an "org/" prefix (Hugging Face repo ids); otherwise `suggestion` is the
// nearest name by edit distance when that is close (at most max(2, length / 4) edits), else empty.
struct PresetNameMatch {
  std::string name;
  std::string suggestion;
};
PresetNameMatch MatchPresetName(std::string_view text, const std::vector<std::string>& names);
// What to append to "X is not a known preset": "; did you mean llama-3.1-8b?" when one is close,
// else "; known: <every name>".
std::string UnknownModelPresetHint(std::string_view text);
std::string UnknownHardwarePresetHint(std::string_view text);
// "a, b, c": the preset names, for error messages and --help.
std::string ModelPresetNames();
std::string HardwarePresetNames();

}  // namespace memplan
