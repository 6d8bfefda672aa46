// A memory-read bandwidth probe: the rate at which n threads stream a buffer much larger than the
// caches, which bounds token generation (every weight is read once per decoded token).
#pragma once

#include <cstdint>

namespace bonsai {

struct BandwidthResult {
    double bytes_per_s = 0.0;     // best repeat
    double mean_bytes_per_s = 0.0;
    uint64_t buffer_bytes = 0;
    int n_threads = 0;
    int repeats = 0;
};

// Allocates and touches buffer_bytes (rounded down to 64-byte lines, at least 1 MiB), then reads
// it `repeats` times with n_threads threads (0 = hardware concurrency), each summing a contiguous
// share. Throws bonsai::Error for bad arguments or when the buffer cannot be allocated.
BandwidthResult measure_read_bandwidth(uint64_t buffer_bytes, int n_threads, int repeats);

}  // namespace bonsai
