#include "agent/io/safetensors_torch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan::io {

torch::ScalarType TorchDTypeOf(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kBool:
      return torch::kBool;
    case SafetensorsDType::kU8:
      return torch::kByte;
    case SafetensorsDType::kI8:
      return torch::kChar;
    case SafetensorsDType::kF8E5M2:
      return torch::kFloat8_e5m2;
    case SafetensorsDType::kF8E4M3:
      return torch::kFloat8_e4m3fn;
    case SafetensorsDType::kI16:
      return torch::kShort;
    case SafetensorsDType::kU16:
      return torch::kUInt16;
    case SafetensorsDType::kF16:
      return torch::kHalf;
    case SafetensorsDType::kBF16:
      return torch::kBFloat16;
    case SafetensorsDType::kI32:
      return torch::kInt;
    case SafetensorsDType::kU32:
      return torch::kUInt32;
    case SafetensorsDType::kF32:
      return torch::kFloat;
    case SafetensorsDType::kI64:
      return torch::kLong;
    case SafetensorsDType::kU64:
      return torch::kUInt64;
    case SafetensorsDType::kF64:
      return torch::kDouble;
  }
  return torch::kFloat;  // unreachable: the switch covers every enumerator
}

absl::StatusOr<SafetensorsDType> SafetensorsDTypeOf(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBool:
      return SafetensorsDType::kBool;
    case torch::kByte:
      return SafetensorsDType::kU8;
    case torch::kChar:
      return SafetensorsDType::kI8;
    case torch::kFloat8_e5m2:
      return SafetensorsDType::kF8E5M2;
    case torch::kFloat8_e4m3fn:
      return SafetensorsDType::kF8E4M3;
    case torch::kShort:
      return SafetensorsDType::kI16;
    case torch::kUInt16:
      return SafetensorsDType::kU16;
    case torch::kHalf:
      return SafetensorsDType::kF16;
    case torch::kBFloat16:
      return SafetensorsDType::kBF16;
    case torch::kInt:
      return SafetensorsDType::kI32;
    case torch::kUInt32:
      return SafetensorsDType::kU32;
    case torch::kFloat:
      return SafetensorsDType::kF32;
    case torch::kLong:
      return SafetensorsDType::kI64;
    case torch::kUInt64:
      return SafetensorsDType::kU64;
    case torch::kDouble:
      return SafetensorsDType::kF64;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "Torch dtype ", std::string(c10::toString(dtype)), " has no safetensors equivalent"));
  }
}

absl::StatusOr<torch::Tensor> ReadTensor(const SafetensorsReader& reader,
                                         const SafetensorsTensorInfo& tensor) {
  torch::Tensor out;
  try {
    out = torch::empty(tensor.shape, torch::TensorOptions().dtype(TorchDTypeOf(tensor.dtype)));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(reader.name(), ": cannot allocate tensor \"",
                                                     tensor.name,
                                                     "\": ", e.what_without_backtrace()));
  }
  RETURN_IF_ERROR(reader.ReadTensorBytes(tensor, out.data_ptr(), tensor.size_bytes()));
  return out;
}

absl::StatusOr<std::vector<NamedParam>> ReadSafetensorsFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader, SafetensorsReader::Open(path));
  std::vector<NamedParam> out;
  out.reserve(reader->header().tensors.size());
  for (const SafetensorsTensorInfo& info : reader->header().tensors) {
    ASSIGN_OR_RETURN(torch::Tensor t, ReadTensor(*reader, info));
    out.push_back({info.name, std::move(t)});
  }
  return out;
}

absl::Status SaveSafetensorsFile(const std::string& path, const std::vector<NamedParam>& tensors,
                                 const SafetensorsMetadata& metadata) {
  std::vector<SafetensorsTensorView> layout;
  layout.reserve(tensors.size());
  for (const NamedParam& t : tensors) {
    if (!t.param.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" is undefined"));
    }
    ASSIGN_OR_RETURN(SafetensorsDType dtype, SafetensorsDTypeOf(t.param.scalar_type()));
    layout.push_back({t.name, dtype, t.param.sizes().vec(), nullptr});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFileWriter> writer,
                   SafetensorsFileWriter::Create(path, layout, metadata));
  for (const NamedParam& t : tensors) {
    torch::Tensor cpu;
    try {
      torch::NoGradGuard no_grad;
      cpu = t.param.detach().to(torch::kCPU).contiguous();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("cannot stage tensor \"", t.name,
                                              "\" to the host: ", e.what_without_backtrace()));
    }
    RETURN_IF_ERROR(writer->AppendTensor(cpu.data_ptr(), cpu.numel() * cpu.element_size()));
  }
  return writer->Finish();
}

}  // namespace memplan::io
