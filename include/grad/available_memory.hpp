// The memory this machine can still give a process: what nn::Lm's automatic
// activation recompute measures a training step against (lm/model.hpp).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace grad {

// Bytes available for new allocations without swapping: Linux's estimate
// (MemAvailable in /proc/meminfo: free memory plus the page cache and
// reclaimable slabs it could drop), else the free physical pages; 0 when
// neither is known. Reads at most 16 KiB of /proc/meminfo.
inline std::size_t available_memory() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char text[16384];
    const std::size_t n = std::fread(text, 1, sizeof text - 1, f);
    std::fclose(f);
    text[n] = '\0';
    if (const char* line = std::strstr(text, "MemAvailable:")) {
      unsigned long long kib = 0;
      if (std::sscanf(line + 13, "%llu", &kib) == 1)
        return kib > static_cast<unsigned long long>(static_cast<std::size_t>(-1) / 1024) ? static_cast<std::size_t>(-1)
                                                                                        : static_cast<std::size_t>(kib) * 1024;
    }
  }
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
#endif
  return 0;
}

}  // namespace grad
