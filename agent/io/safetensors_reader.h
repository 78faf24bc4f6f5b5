// SafetensorsReader: opens a safetensors file, validates its header (safetensors_format.h) and
// copies tensor bytes into caller buffers with bounded positional reads (no mmap).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/io/random_access_file.h"
#include "agent/io/safetensors_format.h"

namespace memplan::io {

// Thread-safe after Open: reads are positional and the header is immutable.
class SafetensorsReader {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(
      std::unique_ptr<RandomAccessFile> file);

  const SafetensorsHeader& header() const { return header_; }
  const std::string& name() const { return file_->name(); }

  // Copies the tensor's raw (little-endian) bytes into `dst`, which must hold exactly
  // tensor.size_bytes() bytes. `tensor` must come from header().
  absl::Status ReadTensorBytes(const SafetensorsTensorInfo& tensor, void* dst,
                               int64_t dst_bytes) const;
  // Same, by name (NOT_FOUND when absent).
  absl::Status ReadTensorBytes(std::string_view tensor_name, void* dst, int64_t dst_bytes) const;
  // Bytes [offset, offset + dst_bytes) of the tensor's data (one positional read): a part of a
  // tensor without reading the rest. OUT_OF_RANGE when the range leaves the tensor.
  absl::Status ReadTensorBytesAt(const SafetensorsTensorInfo& tensor, int64_t offset_bytes,
                                 void* dst, int64_t dst_bytes) const;

 private:
  SafetensorsReader(std::unique_ptr<RandomAccessFile> file, SafetensorsHeader header)
      : file_(std::move(file)), header_(std::move(header)) {}

  std::unique_ptr<RandomAccessFile> file_;
  SafetensorsHeader header_;
};

}  // namespace memplan::io
