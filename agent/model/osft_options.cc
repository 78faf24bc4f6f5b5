#include "agent/model/osft_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/model/lora_options.h"

namespace memplan {

bool OsftOptions::Targets(absl::string_view module) const {
  return std::find(targets.begin(), targets.end(), module) != targets.end();
}

absl::Status ValidateOsftOptions(const OsftOptions& osft, const ModelSpec& spec,
                                 absl::string_view prefix) {
  if (!(osft.rank_ratio > 0 && osft.rank_ratio < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "rank_ratio = ", osft.rank_ratio,
        "; allowed: 0 < ratio < 1 (the fraction of each weight's spectrum that trains)"));
  }
  const std::string allowed = absl::StrJoin(kLoraModuleNames, ", ");
  if (osft.targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "targets is empty; allowed: ", allowed, ", or all"));
  }
  for (size_t i = 0; i < osft.targets.size(); ++i) {
    if (std::find(kLoraModuleNames.begin(), kLoraModuleNames.end(), osft.targets[i]) ==
        kLoraModuleNames.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "targets has '", osft.targets[i], "'; allowed: ", allowed));
    }
    for (size_t j = 0; j < i; ++j) {
      if (osft.targets[j] == osft.targets[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "targets lists '", osft.targets[i], "' twice"));
      }
    }
  }
  if (spec.IsMoe() || spec.IsVisionLanguage()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "rank_ratio: OSFT runs on dense decoder models; ", spec.name,
        " has ", spec.IsMoe() ? "mixture-of-experts layers" : "a vision tower"));
  }
  return absl::OkStatus();
}

}  // namespace memplan
