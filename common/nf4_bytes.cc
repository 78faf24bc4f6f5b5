#include "common/nf4_bytes.h"

#include <algorithm>

#include "common/param_shapes.h"

namespace memplan {
namespace {

constexpr std::string_view kQuantizedProjections[] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// The projection ("mlp.gate_proj") a quantized weight name belongs to; empty when not quantized.
std::string_view QuantizedProjection(std::string_view name) {
  if (!name.starts_with("model.layers.")) return {};
  for (std::string_view proj : kQuantizedProjections) {
    const std::string suffix = std::string(".") + std::string(proj) + ".weight";
    if (name.ends_with(suffix)) return proj;
  }
  return {};
}

}  // namespace

bool QloraQuantizes(std::string_view name) { return !QuantizedProjection(name).empty(); }

std::vector<LayoutParam> QloraBaseLayoutParams(const ModelSpec& model, int64_t dtype_bytes) {
  return QloraLayoutParams(model, dtype_bytes, TrainingMethod{});
}

std::vector<LayoutParam> QloraLayoutParams(const ModelSpec& model, int64_t dtype_bytes,
                                           const TrainingMethod& training) {
  std::vector<LayoutParam> params;
  const int64_t rank = training.lora_rank;
  for (const ParamShape& p : HfParamShapes(model)) {
    if (!QloraQuantizes(p.name)) {
      params.push_back({p.name, p.numel(), dtype_bytes, p.group});
      continue;
    }
    const Nf4PartBytes parts = Nf4Parts(p.numel());
    params.push_back({p.name + std::string(kNf4DataSuffix), parts.data_bytes, 1, p.group});
    params.push_back(
        {p.name + std::string(kNf4AbsmaxCodeSuffix), parts.absmax_code_bytes, 1, p.group});
    params.push_back(
        {p.name + std::string(kNf4AbsmaxScaleSuffix), parts.absmax_scale_bytes / 4, 4, p.group});
    // "...mlp.gate_proj" adapted when "gate_proj" is a target.
    const std::string_view proj = QuantizedProjection(p.name);
    const std::string_view module = proj.substr(proj.rfind('.') + 1);
    bool adapted = false;
    for (const std::string& t : training.lora_target_modules) adapted |= t == module;
    if (!adapted || rank <= 0) continue;
    const std::string stem = p.name.substr(0, p.name.size() - std::string_view(".weight").size());
    const int64_t out = p.shape[0], in = p.shape[1];
    params.push_back({stem + ".lora_A.weight", rank * in, dtype_bytes, p.group});
    params.push_back({stem + ".lora_B.weight", out * rank, dtype_bytes, p.group});
  }
  return params;
}

bool IsLoraAdapterParam(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

int64_t QloraBlockBaseBytes(const ModelSpec& model, int64_t dtype_bytes) {
  int64_t bytes = 0;
  for (const ParamShape& p : HfParamShapes(model)) {
    if (p.group != 1) continue;  // every block has the same parameters
    bytes += QloraQuantizes(p.name) ? Nf4Parts(p.numel()).total() : p.numel() * dtype_bytes;
  }
  return bytes;
}

int64_t QloraBlockDequantTrafficBytes(const ModelSpec& model, int64_t dtype_bytes) {
  int64_t bytes = 0;
  for (const ParamShape& p : HfParamShapes(model)) {
    if (p.group == 1 && QloraQuantizes(p.name)) {
      bytes += Nf4Parts(p.numel()).total() + p.numel() * dtype_bytes;
    }
  }
  return bytes;
}

DequantTransient QloraDequantTransient(const ModelSpec& model, int64_t dtype_bytes) {
  DequantTransient largest;
  for (const ParamShape& p : HfParamShapes(model)) {
    if (p.group != 1) continue;
    const std::string_view proj = QuantizedProjection(p.name);
    // Strictly larger: among equal sizes the first in [Parameter order] is named.
    if (!proj.empty() && p.numel() * dtype_bytes > largest.bytes) {
      largest = {std::string(proj), p.numel() * dtype_bytes};
    }
  }
  return largest;
}

}  // namespace memplan
