#include "agent/chunks/host_buffer.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MEMPLAN_HOST_BUFFER_CUDA 1
#endif

namespace memplan {
namespace {

// 64 B keeps every AVX-512 load within one cache line pair; parameters inside a chunk are
// aligned further by the layout. Pinned buffers start on a 2 MiB boundary (a huge page where
// the kernel gives one; cudaHostRegister pins whole pages).
constexpr std::align_val_t kPageableAlignment{64};
constexpr std::align_val_t kPinnedAlignment{size_t{2} << 20};

// [Parallel zero fill] Zeroing is what commits a fresh buffer's pages, and a page fault costs
// more than writing the page: one thread commits about 2 GB/s (H200 hosts: 64 GB of pinned
// chunks took 38 s), so up to 16 threads each fill a slice of at least 8 MiB (a chunk's buffer
// is 32 MiB to 1 GiB).
void ZeroFill(void* data, int64_t bytes) {
  constexpr int64_t kSlice = int64_t{8} << 20;
  const int64_t hardware = std::max<int64_t>(std::thread::hardware_concurrency(), 1);
  const int64_t threads = std::clamp<int64_t>(bytes / kSlice, 1, std::min<int64_t>(hardware, 16));
  if (threads == 1) {
    std::memset(data, 0, static_cast<size_t>(bytes));
    return;
  }
  char* base = static_cast<char*>(data);
  const int64_t per = (bytes + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t from = t * per, len = std::min(per, bytes - from);
    if (len <= 0) break;
    pool.emplace_back([base, from, len] { std::memset(base + from, 0, static_cast<size_t>(len)); });
  }
  for (std::thread& t : pool) t.join();
}

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
  // Committed by ZeroFill's threads, then pinned where it lies (cudaHostRegister): cudaHostAlloc
  // faults and pins page by page on one thread (about 1.7 GB/s on an H200 host).
  void* data = ::operator new(static_cast<size_t>(bytes), kPinnedAlignment, std::nothrow);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", bytes, " bytes of host memory to pin failed"));
  }
  ZeroFill(data, bytes);
  const cudaError_t err = cudaHostRegister(data, static_cast<size_t>(bytes),
                                           cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    ::operator delete(data, kPinnedAlignment);
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaHostRegister of ", bytes, " bytes failed: ", cudaGetErrorString(err),
                     " (RLIMIT_MEMLOCK soft limit: ", MemlockLimit(),
                     "; raise it with ulimit -l or the container's memlock setting)"));
  }
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
  ZeroFill(data, bytes);
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
    cudaHostUnregister(data_);
#endif
    ::operator delete(data_, kPinnedAlignment);
  } else {
    ::operator delete(data_, kPageableAlignment);
  }
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace memplan
