// Small POSIX file-system helpers. Code linked with Torch must not call std::filesystem:
// libtorch.so exports its own (older) std::filesystem symbols, which interpose on the program's
// and crash (e.g. remove_all on a non-empty directory segfaults). These use POSIX calls only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan::io {

// "a" + "b" -> "a/b" (no doubled slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);
// Last component ("a/b/" -> "b") and everything before it ("a/b" -> "a", "b" -> ".").
std::string Basename(absl::string_view path);
std::string Dirname(absl::string_view path);
// Absolute, lexically (relative paths are joined to the working directory; no symlink lookup).
std::string AbsolutePath(absl::string_view path);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);    // follows symlinks
bool IsRegularFile(const std::string& path);  // follows symlinks
absl::StatusOr<int64_t> FileSizeBytes(const std::string& path);

// mkdir -p (mode 0755); OK when the directory exists.
absl::Status CreateDirectories(const std::string& path);
// Sorted entry names without "." and "..".
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);
// rm -rf without following symlinks; OK when `path` does not exist.
absl::Status RemoveAll(const std::string& path);

}  // namespace memplan::io
