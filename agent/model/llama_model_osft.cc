// LlamaModel's OSFT split and gradient projection ([OSFT], agent/model/osft.h); the rest of the
// model is llama_model.cc.
#include <memory>

#include "absl/strings/str_cat.h"
#include "agent/model/block_params.h"
#include "agent/model/layers.h"
#include "agent/model/llama_model.h"
#include "agent/model/osft.h"

namespace memplan {

absl::Status LlamaModel::SplitOsft() {
  if (!has_osft() || osft_split_) return absl::OkStatus();
  try {
    const auto store = torch::TensorOptions()
                           .dtype(ToScalarType(options_.dtype))
                           .device(options_.param_device.value_or(options_.device));
    for (const auto& b : blocks_) {
      const auto slots = b->Projections();
      for (size_t m = 0; m < kLoraModuleNames.size(); ++m) {
        if (!options_.osft.Targets(kLoraModuleNames[m]) || !slots[m]->defined()) continue;
        b->osft[m] = std::make_unique<OsftFactors>(
            OsftSplit(*slots[m], options_.osft.rank_ratio, options_.device, store));
        *slots[m] = torch::Tensor();  // the factors replace it
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("osft: SVD split failed: ", e.what_without_backtrace()));
  }
  osft_split_ = true;
  return absl::OkStatus();
}

void LlamaModel::ProjectOsftGrads() {
  for (const auto& b : blocks_) {
    for (const auto& f : b->osft) {
      if (f) memplan::ProjectOsftGrads(*f);
    }
  }
}

}  // namespace memplan
