// Writes safetensors files: tensors are laid out in the order given, the JSON header is padded
// with spaces to a multiple of 8 bytes (so every tensor starts 8-byte aligned in the file) and
// re-validated with ParseSafetensorsHeader before anything is written.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/io/safetensors_format.h"

namespace memplan::io {

// A tensor to write: `data` points at numel x item-size little-endian bytes owned by the caller
// (may be null only when the tensor is empty).
struct SafetensorsTensorView {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

using SafetensorsMetadata = std::map<std::string, std::string>;

// The header text (without the length prefix) for tensors laid out in order; `data` is not
// used. INVALID_ARGUMENT for an empty, duplicated or reserved ("__metadata__") name, a negative
// dimension or a byte size that overflows.
absl::StatusOr<std::string> BuildSafetensorsHeader(
    const std::vector<SafetensorsTensorView>& tensors, const SafetensorsMetadata& metadata);

// Streams one file: the header is written at Create from the layout (views without data), then
// each tensor's bytes are appended in layout order. Not thread-safe.
class SafetensorsFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> Create(
      const std::string& path, const std::vector<SafetensorsTensorView>& layout,
      const SafetensorsMetadata& metadata);
  ~SafetensorsFileWriter();

  // The bytes of the next tensor; `size_bytes` must equal its layout size.
  absl::Status AppendTensor(const void* data, int64_t size_bytes);
  // Checks every tensor was written, fsyncs and closes.
  absl::Status Finish();

 private:
  class Impl;
  explicit SafetensorsFileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The whole file in memory (tests, small files). Every non-empty view needs `data`.
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensorView>& tensors,
                                                 const SafetensorsMetadata& metadata);

// Writes `path` and fsyncs it. Not atomic by itself: callers that publish files write to a
// temporary name and rename (see checkpoint.h).
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<SafetensorsTensorView>& tensors,
                                  const SafetensorsMetadata& metadata);

}  // namespace memplan::io
