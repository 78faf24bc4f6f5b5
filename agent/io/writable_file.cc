#include "agent/io/writable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/io/random_access_file.h"
#include "common/status.h"

namespace memplan::io {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WritableFile>> WritableFile::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", path);
  return std::unique_ptr<WritableFile>(new WritableFile(fd, path));
}

WritableFile::~WritableFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status WritableFile::Append(const void* data, int64_t length_bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
  const char* p = static_cast<const char*>(data);
  while (length_bytes > 0) {
    const size_t chunk = static_cast<size_t>(std::min<int64_t>(length_bytes, int64_t{1} << 30));
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path_);
    }
    p += n;
    length_bytes -= n;
    written_bytes_ += n;
  }
  return absl::OkStatus();
}

absl::Status WritableFile::Sync() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
  if (::fsync(fd_) != 0) return Errno("fsync", path_);
  return absl::OkStatus();
}

absl::Status WritableFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  const int fd = fd_;
  fd_ = -1;
  // close() can report a deferred write error (e.g. NFS); it must not be ignored.
  if (::close(fd) != 0) return Errno("close", path_);
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, WritableFile::Create(path));
  RETURN_IF_ERROR(file->Append(contents));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory", dir);
  const int rc = ::fsync(fd);
  absl::Status status = rc == 0 ? absl::OkStatus() : Errno("fsync directory", dir);
  ::close(fd);
  return status;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenRandomAccessFile(path));
  if (file->size_bytes() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", file->size_bytes(), " bytes exceeds the limit of ", max_bytes));
  }
  std::string contents(static_cast<size_t>(file->size_bytes()), '\0');
  RETURN_IF_ERROR(file->ReadAt(0, file->size_bytes(), contents.data()));
  return contents;
}

}  // namespace memplan::io
