// What the host can still give a process: MemAvailable of /proc/meminfo (free memory plus the
// page cache and reclaimable slabs the kernel would drop), the figure that says whether an
// allocation will be backed or end in the kernel's OOM kill. malloc does not say: Linux
// overcommits, so a too-large run is killed while touching the pages, with no message.
#pragma once
#include <cstdint>
#include <string>

namespace mxtrain {

// MemAvailable in bytes, or 0 when /proc/meminfo is missing or has no such line.
uint64_t host_available_bytes();
// Parses the text of /proc/meminfo ("MemAvailable:  1234 kB"); 0 when absent (tests).
uint64_t parse_mem_available(const std::string& meminfo);

}  // namespace mxtrain
