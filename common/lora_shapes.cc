#include "common/lora_shapes.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/optimizer_bytes.h"

namespace memplan {

std::vector<ParamShape> LoraParamShapes(const ModelSpec& m, const TrainingMethod& method) {
  std::vector<ParamShape> out;
  if (method.kind == TrainingKind::kFull || method.lora_rank <= 0) return out;
  const int64_t d = m.HeadDim();
  const int64_t r = method.lora_rank;
  // (in, out) per module, kLoraModules order.
  const std::array<std::pair<int64_t, int64_t>, kLoraModules.size()> dims = {{
      {m.hidden_size, m.num_heads * d},
      {m.hidden_size, m.num_kv_heads * d},
      {m.hidden_size, m.num_kv_heads * d},
      {m.num_heads * d, m.hidden_size},
      {m.hidden_size, m.intermediate_size},
      {m.hidden_size, m.intermediate_size},
      {m.intermediate_size, m.hidden_size},
  }};
  for (int64_t b = 0; b < m.num_layers; ++b) {
    for (size_t k = 0; k < kLoraModules.size(); ++k) {
      const auto& targets = method.lora_target_modules;
      if (std::find(targets.begin(), targets.end(), kLoraModules[k]) == targets.end()) continue;
      const std::string stem =
          absl::StrCat("model.layers.", b, k < 4 ? ".self_attn." : ".mlp.", kLoraModules[k]);
      const int group = static_cast<int>(b) + 1;
      out.push_back({stem + ".lora_A.weight", {r, dims[k].first}, group});
      out.push_back({stem + ".lora_B.weight", {dims[k].second, r}, group});
    }
  }
  return out;
}

std::vector<LayoutParam> LoraLayoutParams(const ModelSpec& model, const TrainingMethod& method,
                                          int64_t dtype_bytes) {
  std::vector<LayoutParam> out;
  for (const ParamShape& s : LoraParamShapes(model, method)) {
    out.push_back({s.name, s.numel(), dtype_bytes, s.group});
  }
  return out;
}

absl::StatusOr<LoraAdapterBytes> PersistentLoraAdapterBytes(const ModelSpec& model,
                                                            const TrainingMethod& method,
                                                            int64_t dtype_bytes,
                                                            const ChunkPackingOptions& packing,
                                                            OptimizerKind optimizer) {
  const std::vector<LayoutParam> params = LoraLayoutParams(model, method, dtype_bytes);
  LoraAdapterBytes b;
  if (params.empty()) return b;
  absl::StatusOr<ChunkPacking> layout = ChunkPacking::Build(params, packing);
  if (!layout.ok()) return layout.status();
  int64_t largest = 0;
  for (const LayoutParam& p : params) {
    b.params += p.numel;
    b.grad_bytes += p.numel * dtype_bytes;
  }
  for (const ChunkInfo& c : layout->chunks()) {
    b.chunk_bytes += c.size_bytes;
    b.state_bytes +=
        c.size_bytes / dtype_bytes * PersistentStateBytesPerElem(optimizer, dtype_bytes);
    largest = std::max(largest, c.size_bytes);
  }
  b.step_extra_bytes = StepGradCopyElems(largest / dtype_bytes, packing.chunk_bytes, dtype_bytes) *
                       StepGradCopyBytesPerElem(optimizer, dtype_bytes);
  b.num_chunks = layout->num_chunks();
  return b;
}

}  // namespace memplan
