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
  // Compared piecewise (no concatenated suffix string): GCC 12's -Wrestrict misfires on
  // std::string concatenation at -O2/-O3, which broke the Release build.
  constexpr std::string_view kWeight = ".weight";
  if (!name.starts_with("model.layers.") || !name.ends_with(kWeight)) return {};
  name.remove_suffix(kWeight.size());
  for (std::string_view proj : kQuantizedProjections) {
    if (name.size() > proj.size() && name.ends_with(proj) &&
        name[name.size() - proj.size() - 1] == '.') {
      return proj;
    }
  }
  return {};
}

}  // namespace

bool QloraQuantizes(std::string_view name) { return !QuantizedProjection(name).empty(); }

std::vector<LayoutParam> QloraBaseLayoutParams(const ModelSpec& model, int64_t dtype_bytes) {
  std::vector<LayoutParam> params;
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
  }
  return params;
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
