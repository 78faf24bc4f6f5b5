#include "agent/chunks/host_buffer.h"

#include <sys/resource.h>

#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MEMPLAN_HOST_BUFFER_CUDA 1
#endif

namespace memplan {
namespace {

// 64 B keeps every AVX-512 load within one cache line pair; parameters inside a chunk are
// aligned further by the layout.
constexpr std::align_val_t kPageableAlignment{64};

std::string MemlockLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return absl::StrCat(static_cast<uint64_t>(limit.rlim_cur), " bytes");
}

}  // namespace

absl::StatusOr<HostBuffer> HostBuffer::AllocatePinned(int64_t bytes) {
#ifdef MEMPLAN_HOST_BUFFER_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky error so later CUDA calls are not confused
    return absl::FailedPreconditionError(
        "pinned host memory needs a CUDA device and none is available");
  }
  if (bytes == 0) return HostBuffer(nullptr, 0, true);
  void* data = nullptr;
  const cudaError_t err = cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaHostAlloc of ", bytes, " bytes failed: ", cudaGetErrorString(err),
                     " (RLIMIT_MEMLOCK soft limit: ", MemlockLimit(),
                     "; raise it with ulimit -l or the container's memlock setting)"));
  }
  std::memset(data, 0, static_cast<size_t>(bytes));
  return HostBuffer(data, bytes, true);
#else
  return absl::FailedPreconditionError(
      "pinned host memory needs CUDA, and this build has no CUDA runtime");
#endif
}

HostBuffer HostBuffer::AllocatePageable(int64_t bytes) {
  if (bytes == 0) return HostBuffer(nullptr, 0, false);
  void* data = ::operator new(static_cast<size_t>(bytes), kPageableAlignment);
  // Touch every page now so the memory is committed where the plan says, not at first use.
  std::memset(data, 0, static_cast<size_t>(bytes));
  return HostBuffer(data, bytes, false);
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      pinned_(other.pinned_) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    pinned_ = other.pinned_;
  }
  return *this;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() {
  if (data_ == nullptr) return;
  if (pinned_) {
#ifdef MEMPLAN_HOST_BUFFER_CUDA
    cudaFreeHost(data_);
#endif
  } else {
    ::operator delete(data_, kPageableAlignment);
  }
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace memplan
