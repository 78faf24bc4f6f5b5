// Named architectures (published Hugging Face configs) and hardware (published figures).
// A measured hardware profile submitted by an agent supersedes a preset of the same name.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace memplan {

const std::vector<ModelSpec>& ModelPresets();
const std::vector<HardwareSpec>& HardwarePresets();
std::optional<ModelSpec> FindModelPreset(std::string_view name);
std::optional<HardwareSpec> FindHardwarePreset(std::string_view name);
// "a, b, c": the preset names, for error messages and --help.
std::string ModelPresetNames();
std::string HardwarePresetNames();

}  // namespace memplan
