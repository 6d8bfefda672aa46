// Run-time CPU feature detection and the choice of kernel path (see CpuPath in bonsai/ops.h).
#pragma once

#include "bonsai/ops.h"

namespace bonsai::cpu {

bool cpu_has_avx2();    // AVX2 + FMA + F16C
bool cpu_has_avx512();  // AVX-512 F/BW/VL/VNNI (+ the AVX2 set)
bool cpu_path_available(CpuPath path);

// The AVX-512 path unpacks base-3 weights with AVX-512 VBMI byte lookups when the CPU has VBMI
// (same results as without). Tests and benchmarks switch the lookups off to cover the other variant.
bool cpu_has_avx512_vbmi();
bool avx512_vbmi_enabled();
void set_avx512_vbmi_enabled(bool enabled);

}  // namespace bonsai::cpu
