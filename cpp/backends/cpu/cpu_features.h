// Run-time CPU feature detection and the choice of kernel path (see CpuPath in bonsai/ops.h).
#pragma once

#include "bonsai/ops.h"

namespace bonsai::cpu {

bool cpu_has_avx2();    // AVX2 + FMA + F16C
bool cpu_has_avx512();  // AVX-512 F/BW/VL/VNNI (+ the AVX2 set)
bool cpu_path_available(CpuPath path);

}  // namespace bonsai::cpu
