// The safetensors file format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets"}, ...,
// "__metadata__": {str: str}}, then the data section. ParseSafetensorsHeader validates every field
// against the data section size and returns INVALID_ARGUMENT naming the tensor and field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan::io {

// Byte-sized dtypes of the format (sub-byte F4/F6 types are rejected as unknown).
enum class SafetensorsDType {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64
};

int64_t SafetensorsDTypeBytes(SafetensorsDType dtype);
std::string_view SafetensorsDTypeName(SafetensorsDType dtype);  // "F32", "BF16", ...
std::optional<SafetensorsDType> ParseSafetensorsDType(std::string_view name);

// Headers larger than this are rejected before any allocation (the reference implementation's
// limit).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// More dimensions than this is not a model tensor; bounding it bounds per-tensor work.
inline constexpr int kMaxSafetensorsRank = 32;
// The 8-byte length prefix.
inline constexpr int64_t kSafetensorsPrefixBytes = 8;

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  int64_t begin_bytes = 0;  // offsets inside the data section, [begin, end)
  int64_t end_bytes = 0;

  int64_t size_bytes() const { return end_bytes - begin_bytes; }
  int64_t numel() const;  // product of shape (1 for a scalar); validated not to overflow
};

struct SafetensorsHeader {
  // Sorted by position in the data section; they tile it exactly.
  std::vector<SafetensorsTensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  int64_t data_offset_bytes = 0;                // 8 + header length: start of the data section
  int64_t data_bytes = 0;

  // nullptr when absent.
  const SafetensorsTensorInfo* Find(std::string_view name) const;

  std::unordered_map<std::string, size_t> index;  // name -> position in `tensors`
};

// Validates `json` (the header text) for a data section of `data_bytes`: well-formed JSON object
// without duplicate keys, known dtypes, non-negative shapes whose byte size does not overflow and
// equals the data_offsets span, offsets in range, non-overlapping and covering the data section
// exactly, __metadata__ a string->string map. data_offset_bytes is set to 8 + json.size().
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         int64_t data_bytes);

// Decodes the length prefix of a file of `file_bytes` bytes and checks it fits the file and the
// header limit. Returns the header length N.
absl::StatusOr<int64_t> DecodeSafetensorsHeaderLength(const unsigned char prefix[8],
                                                      int64_t file_bytes);

}  // namespace memplan::io
