// HostBuffer: an exactly sized, zero-filled host allocation, either pinned (committed by several
// threads, then page-locked with cudaHostRegister; no caching-allocator rounding) or pageable
// (the OS may swap it). Move-only RAII owner.
// Thread-compatible.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace memplan {

class HostBuffer {
 public:
  // FAILED_PRECONDITION without a CUDA device; RESOURCE_EXHAUSTED when the driver refuses (the
  // message names the memlock limit, RLIMIT_MEMLOCK, and the bytes asked for).
  static absl::StatusOr<HostBuffer> AllocatePinned(int64_t bytes);
  static HostBuffer AllocatePageable(int64_t bytes);

  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t size_bytes() const { return size_bytes_; }
  bool pinned() const { return pinned_; }

 private:
  HostBuffer(void* data, int64_t size_bytes, bool pinned)
      : data_(data), size_bytes_(size_bytes), pinned_(pinned) {}
  void Release();

  void* data_ = nullptr;
  int64_t size_bytes_ = 0;
  bool pinned_ = false;
};

}  // namespace memplan
