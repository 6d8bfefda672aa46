// The cache level the CPU kernels' software prefetches of streamed data fill (weights in the
// matmul tiles and the GEMM's next panel, KV rows in attention): L2, not L1. A prefetch into L1
// holds one of the core's few L1 miss buffers until its line arrives from memory, so with many
// lines in flight those buffers, not the memory, capped how fast one core streamed. On an AMD EPYC
// (Zen 4, 2 cores) a decode step's ternary products read 21-24 GB/s with T0 hints and 28-31 with
// T2 (bench_decode_matmuls, same runs), where the kernels compute 32 GB/s from the cache; the
// AVX2 path's Q8_0 head 24-25 -> 32-33 GB/s; 2-token GEMM products +23% (PTQ1_0) and +85% (Q8_0);
// decode at depth 2048 0.973x the time from attention's prefetch alone. The loads that follow
// then hit L2, which the out-of-order core hides.
#pragma once

#include <immintrin.h>

namespace bonsai::cpu {

constexpr auto kStreamPrefetchHint = _MM_HINT_T2;  // an enum in GCC, an int in clang

}  // namespace bonsai::cpu
