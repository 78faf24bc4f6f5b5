// WritableFile: sequential POSIX file output with explicit fsync, for writers that must know
// their bytes reached the disk before publishing them (checkpoints, safetensors).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan::io {

// Not thread-safe. The destructor closes the descriptor without syncing.
class WritableFile {
 public:
  // Creates or truncates `path` (mode 0644).
  static absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path);
  ~WritableFile();
  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;

  absl::Status Append(const void* data, int64_t length_bytes);
  absl::Status Append(absl::string_view data) { return Append(data.data(), data.size()); }
  absl::Status Sync();   // fsync: data and metadata are durable on return
  absl::Status Close();  // idempotent
  int64_t written_bytes() const { return written_bytes_; }
  const std::string& path() const { return path_; }

 private:
  WritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  int64_t written_bytes_ = 0;
};

// Writes `contents` to `path`, fsyncs and closes it.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents);

// fsyncs a directory so that entries created or renamed in it are durable.
absl::Status SyncDirectory(const std::string& dir);

// Reads a whole small file (text configs, JSON), refusing files over `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes);

}  // namespace memplan::io
