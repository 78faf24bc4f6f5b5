#include "agent/model/lora_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/validate.h"

namespace memplan {
namespace {

bool KnownModule(absl::string_view name) {
  return std::find(kLoraModuleNames.begin(), kLoraModuleNames.end(), name) !=
         kLoraModuleNames.end();
}

std::string AllowedModules() { return absl::StrJoin(kLoraModuleNames, ", "); }

}  // namespace

bool LoraOptions::Targets(absl::string_view module) const {
  return std::find(targets.begin(), targets.end(), module) != targets.end();
}

absl::StatusOr<std::vector<std::string>> ParseLoraTargetList(absl::string_view field,
                                                             absl::string_view text) {
  if (absl::StripAsciiWhitespace(text) == "all") {
    return std::vector<std::string>(kLoraModuleNames.begin(), kLoraModuleNames.end());
  }
  std::vector<std::string> modules;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::string name(absl::StripAsciiWhitespace(part));
    if (!KnownModule(name)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": unknown module '", name,
                                                     "'; allowed: ", AllowedModules(), " or all"));
    }
    modules.push_back(std::move(name));
  }
  if (modules.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a comma-separated list of ", AllowedModules(), ", or all"));
  }
  return modules;
}

absl::Status ValidateLoraOptions(const LoraOptions& lora, const ModelSpec& spec,
                                 absl::string_view prefix) {
  if (lora.rank < 1 || lora.rank > spec.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "rank = ", lora.rank, "; allowed: 1 to hidden_size (", spec.hidden_size, ")"));
  }
  if (!(lora.alpha > 0) || !std::isfinite(lora.alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "alpha = ", lora.alpha, "; allowed: a finite number > 0"));
  }
  if (!(lora.dropout >= 0 && lora.dropout < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "dropout = ", lora.dropout, "; allowed: 0 <= dropout < 1"));
  }
  if (lora.targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "targets is empty; allowed: ", AllowedModules(), ", or all"));
  }
  for (size_t i = 0; i < lora.targets.size(); ++i) {
    if (!KnownModule(lora.targets[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "targets has '", lora.targets[i], "'; allowed: ", AllowedModules()));
    }
    for (size_t j = 0; j < i; ++j) {
      if (lora.targets[j] == lora.targets[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "targets lists '", lora.targets[i], "' twice"));
      }
    }
  }
  std::vector<std::string> targets;
  for (const char* name : kLoraModuleNames) {
    if (lora.Targets(name)) targets.push_back(name);
  }
  if (absl::Status s = CheckMoeAdapters(spec, lora.nf4_base, targets, prefix); !s.ok()) return s;
  return CheckVisionAdapters(spec, lora.nf4_base, targets, prefix);
}

TrainingMethod LoraTrainingMethod(const LoraOptions& lora) {
  TrainingMethod method;
  if (!lora.enabled()) return method;
  method.kind = lora.nf4_base ? TrainingKind::kQlora : TrainingKind::kLora;
  method.lora_rank = lora.rank;
  // Canonical module order, so that equal sets give equal queries.
  for (const char* name : kLoraModuleNames) {
    if (lora.Targets(name)) method.lora_target_modules.push_back(name);
  }
  return method;
}

}  // namespace memplan
