// RandomAccessFile: bounded positional reads from a file or an in-memory buffer. Readers of
// untrusted formats (safetensors, token files) go through it so that every read is range-checked
// against the real size and tests/fuzzers can feed bytes without touching the disk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memplan::io {

// Thread-safe for concurrent ReadAt calls (pread has no shared file position).
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Size in bytes, fixed at open time.
  virtual int64_t size_bytes() const = 0;
  // Reads exactly `length_bytes` at `offset_bytes` into `dst`. OUT_OF_RANGE when the range is not
  // inside [0, size_bytes()); DATA_LOSS when the file shrank underneath us.
  virtual absl::Status ReadAt(int64_t offset_bytes, int64_t length_bytes, void* dst) const = 0;
  // For error messages: the path, or "<memory>".
  virtual const std::string& name() const = 0;
};

// Opens a regular file read-only (NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION for a non
// regular file).
absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRandomAccessFile(const std::string& path);

// Wraps a copy of `bytes`.
std::unique_ptr<RandomAccessFile> NewMemoryFile(std::string bytes, std::string name = "<memory>");

}  // namespace memplan::io
