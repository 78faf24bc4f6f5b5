#include "agent/io/file_system.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan::io {
namespace {

absl::Status Errno(int err, absl::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

std::string StripTrailingSlashes(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return std::string(path);
}

}  // namespace

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string Basename(absl::string_view path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Dirname(absl::string_view path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string AbsolutePath(absl::string_view path) {
  if (!path.empty() && path.front() == '/') return StripTrailingSlashes(path);
  char buffer[4096];
  if (::getcwd(buffer, sizeof(buffer)) == nullptr) return StripTrailingSlashes(path);
  return StripTrailingSlashes(JoinPath(buffer, path));
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<int64_t> FileSizeBytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Errno(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::Status CreateDirectories(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  if (p.empty() || IsDirectory(p)) return absl::OkStatus();
  const std::string parent = Dirname(p);
  if (parent != p) RETURN_IF_ERROR(CreateDirectories(parent));
  if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return Errno(errno, "mkdir", p);
  if (!IsDirectory(p)) {
    return absl::FailedPreconditionError(absl::StrCat(p, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return Errno(errno, "opendir", path);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(dir);
  if (err != 0) return Errno(err, "readdir", path);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveAll(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno(errno, "lstat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
    for (const std::string& name : names) RETURN_IF_ERROR(RemoveAll(JoinPath(path, name)));
    if (::rmdir(path.c_str()) != 0) return Errno(errno, "rmdir", path);
    return absl::OkStatus();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno(errno, "unlink", path);
  return absl::OkStatus();
}

}  // namespace memplan::io
