// LlamaModel's OSFT split and gradient projection ([OSFT], agent/model/osft.h); the rest of the
// model is llama_model.cc.
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "agent/model/block_params.h"
#include "agent/model/layers.h"
#include "agent/model/llama_model.h"
#include "agent/model/osft.h"

namespace memplan {

absl::Status LlamaModel::SplitOsft() { return MakeOsftFactors(/*svd=*/true); }

// [OSFT resume without the SVD] (agent/model/osft.h)
absl::Status LlamaModel::ShapeOsftFactors() { return MakeOsftFactors(/*svd=*/false); }

absl::Status LlamaModel::MakeOsftFactors(bool svd) {
  if (!has_osft() || osft_split_) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  OsftFactorOrigin origin;
  try {
    const auto store = torch::TensorOptions()
                           .dtype(ToScalarType(options_.dtype))
                           .device(options_.param_device.value_or(options_.device));
    for (const auto& b : blocks_) {
      const auto slots = b->Projections();
      for (size_t m = 0; m < kLoraModuleNames.size(); ++m) {
        if (!options_.osft.Targets(kLoraModuleNames[m]) || !slots[m]->defined()) continue;
        const torch::Tensor& w = *slots[m];
        b->osft[m] = std::make_unique<OsftFactors>(
            svd ? OsftSplit(w, options_.osft.rank_ratio, options_.device, store)
                : OsftZeroFactors(w.size(0), w.size(1), options_.osft.rank_ratio, store));
        ++(svd ? origin.svd_splits : origin.shaped);
        *slots[m] = torch::Tensor();  // the factors replace it
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(svd ? "osft: SVD split failed: "
                                                : "osft: creating the factors failed: ",
                                            e.what_without_backtrace()));
  }
  origin.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  osft_origin_ = origin;
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
