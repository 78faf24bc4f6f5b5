#include "common/types.h"

namespace memplan {

int64_t DTypeBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "bf16";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  return std::nullopt;
}

std::string_view BlockModeName(BlockMode mode) {
  switch (mode) {
    case BlockMode::kNone: return "none";
    case BlockMode::kCkpt: return "ckpt";
    case BlockMode::kSwap: return "swap";
    case BlockMode::kHsOffload: return "hs_offload";
  }
  return "none";
}

std::string_view HostMemoryKindName(HostMemoryKind kind) {
  return kind == HostMemoryKind::kPinned ? "pinned" : "pageable";
}

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdamWBf16States: return "adamw_bf16";
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdamW8bit: return "adamw8bit";
  }
  return "adamw";
}

std::string_view TrainingKindName(TrainingKind kind) {
  switch (kind) {
    case TrainingKind::kFull: return "full";
    case TrainingKind::kLora: return "lora";
    case TrainingKind::kQlora: return "qlora";
    case TrainingKind::kOsft: return "osft";
  }
  return "full";
}

std::optional<OptimizerKind> ParseOptimizer(std::string_view name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "adamw_bf16") return OptimizerKind::kAdamWBf16States;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adamw8bit") return OptimizerKind::kAdamW8bit;
  return std::nullopt;
}

std::string_view OptimizerAllowList() { return "adamw, adamw_bf16, sgd, adamw8bit"; }

}  // namespace memplan
