#include "agent/io/random_access_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memplan::io {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Rejects ranges outside the file before any arithmetic can overflow.
absl::Status CheckRange(int64_t offset_bytes, int64_t length_bytes, int64_t size_bytes,
                        const std::string& name) {
  if (offset_bytes < 0 || length_bytes < 0 || offset_bytes > size_bytes ||
      length_bytes > size_bytes - offset_bytes) {
    return absl::OutOfRangeError(absl::StrCat(name, ": read of ", length_bytes, " bytes at offset ",
                                              offset_bytes, " is outside the file (", size_bytes,
                                              " bytes)"));
  }
  return absl::OkStatus();
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, int64_t size_bytes, std::string path)
      : fd_(fd), size_bytes_(size_bytes), path_(std::move(path)) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  int64_t size_bytes() const override { return size_bytes_; }
  const std::string& name() const override { return path_; }

  absl::Status ReadAt(int64_t offset_bytes, int64_t length_bytes, void* dst) const override {
    if (absl::Status s = CheckRange(offset_bytes, length_bytes, size_bytes_, path_); !s.ok()) {
      return s;
    }
    char* out = static_cast<char*>(dst);
    while (length_bytes > 0) {
      // Large reads are split: pread may return short counts (and Linux caps one call ~2 GiB).
      const size_t want = static_cast<size_t>(std::min<int64_t>(length_bytes, int64_t{1} << 30));
      const ssize_t got = ::pread(fd_, out, want, static_cast<off_t>(offset_bytes));
      if (got < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "pread", path_);
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(path_, ": unexpected end of file at offset ",
                                                offset_bytes,
                                                " (the file shrank after it was opened)"));
      }
      out += got;
      offset_bytes += got;
      length_bytes -= got;
    }
    return absl::OkStatus();
  }

 private:
  const int fd_;
  const int64_t size_bytes_;
  const std::string path_;
};

class MemoryFile final : public RandomAccessFile {
 public:
  MemoryFile(std::string bytes, std::string name)
      : bytes_(std::move(bytes)), name_(std::move(name)) {}

  int64_t size_bytes() const override { return static_cast<int64_t>(bytes_.size()); }
  const std::string& name() const override { return name_; }

  absl::Status ReadAt(int64_t offset_bytes, int64_t length_bytes, void* dst) const override {
    if (absl::Status s = CheckRange(offset_bytes, length_bytes, size_bytes(), name_); !s.ok()) {
      return s;
    }
    if (length_bytes > 0) std::memcpy(dst, bytes_.data() + offset_bytes, length_bytes);
    return absl::OkStatus();
  }

 private:
  const std::string bytes_;
  const std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRandomAccessFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "fstat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  return std::unique_ptr<RandomAccessFile>(
      new PosixRandomAccessFile(fd, static_cast<int64_t>(st.st_size), path));
}

std::unique_ptr<RandomAccessFile> NewMemoryFile(std::string bytes, std::string name) {
  return std::make_unique<MemoryFile>(std::move(bytes), std::move(name));
}

}  // namespace memplan::io
