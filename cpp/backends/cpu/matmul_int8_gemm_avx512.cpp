// AVX-512 F/BW/VL/VNNI multi-token INT8 matmul (base-3 bytes unpacked with 16-bit multiplies); the
// algorithm is described in matmul_int8_gemm_impl.h. Chosen at run time on CPUs without AVX-512 VBMI.
#define BONSAI_GEMM_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define BONSAI_GEMM_TRIT_LUT 0
#define BONSAI_GEMM_ENTRY matmul_int8_gemm_avx512
#include "matmul_int8_gemm_impl.h"
