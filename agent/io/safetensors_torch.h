// Named Torch tensors <-> safetensors files: dtype mapping, reading tensors into CPU tensors of
// their stored dtype, and writing any tensors (copied to contiguous CPU memory first).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/io/safetensors_reader.h"
#include "agent/io/safetensors_writer.h"
#include "agent/core/param_residency.h"

namespace memplan::io {

torch::ScalarType TorchDTypeOf(SafetensorsDType dtype);
// INVALID_ARGUMENT for Torch dtypes the format cannot store (complex, quantized, ...).
absl::StatusOr<SafetensorsDType> SafetensorsDTypeOf(torch::ScalarType dtype);

// One tensor as a new contiguous CPU tensor of its stored dtype and shape.
absl::StatusOr<torch::Tensor> ReadTensor(const SafetensorsReader& reader,
                                         const SafetensorsTensorInfo& tensor);

// Every tensor of a file, in data order.
absl::StatusOr<std::vector<NamedParam>> ReadSafetensorsFile(const std::string& path);

// Writes `tensors` (any device or dtype the format stores; names unique) to `path`, fsynced.
// Tensors are staged to CPU one at a time, so host memory grows by the largest tensor only.
absl::Status SaveSafetensorsFile(const std::string& path, const std::vector<NamedParam>& tensors,
                                 const SafetensorsMetadata& metadata = {});

}  // namespace memplan::io
