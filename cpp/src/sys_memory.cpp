// Reads MemAvailable (the kernel's estimate of memory usable without swapping) from /proc/meminfo.
#include "sys_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace bonsai {

uint64_t mem_available_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("MemAvailable:", 0) == 0) {
            std::istringstream is(line.substr(13));
            uint64_t kib = 0;
            is >> kib;
            return kib * 1024;
        }
    }
    return 0;
}

std::string format_bytes(uint64_t bytes) {
    char buf[32];
    const double b = static_cast<double>(bytes);
    if (b >= 1024.0 * 1024 * 1024) {
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    } else if (b >= 1024.0 * 1024) {
        std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
    } else {
        std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
    }
    return buf;
}

}  // namespace bonsai
