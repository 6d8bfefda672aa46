// Available system memory, for refusing allocations that cannot fit before they are attempted.
#pragma once

#include <cstdint>
#include <string>

namespace bonsai {

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read (the check is then skipped).
uint64_t mem_available_bytes();

// "1.25 GiB", "512.0 MiB", "3.0 KiB" for messages and reports.
std::string format_bytes(uint64_t bytes);

}  // namespace bonsai
