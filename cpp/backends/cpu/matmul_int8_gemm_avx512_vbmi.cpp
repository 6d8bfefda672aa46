// AVX-512 VNNI + VBMI multi-token INT8 matmul (base-3 bytes unpacked with vpermi2b table lookups);
// the algorithm is described in matmul_int8_gemm_impl.h. Chosen at run time on CPUs with AVX-512 VBMI.
#define BONSAI_GEMM_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c"
#define BONSAI_GEMM_TRIT_LUT 1
#define BONSAI_GEMM_ENTRY matmul_int8_gemm_avx512_vbmi
#include "matmul_int8_gemm_impl.h"
