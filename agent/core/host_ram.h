// The host's physical RAM: what the bench reports as the profile's host_memory_bytes and the
// trainer checks its pinned activation copies against. Header-only.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace memplan {

// Bytes of physical memory (sysconf); 0 when unknown.
inline int64_t HostRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

}  // namespace memplan
