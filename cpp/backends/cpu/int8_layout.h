// The "unit" layout shared by the SIMD INT8 kernels and the activation quantizer.
//
// A unit is G consecutive weight blocks (G = 1, 2 or 4) whose integer codes fill C code vectors of
// 64 bytes each: block g of the unit owns bytes [64g/G, 64(g+1)/G) of every code vector, i.e. whole
// 128-bit chunks. Codes are unsigned (trit + 1, 2-bit code, Q4_0 nibble; the weight is code - off)
// except for Q8_0, whose codes are the signed weights themselves (off = 0, is_signed).
// The kernels produce codes in whatever order is cheapest to unpack (e.g. trit n of every byte of
// a PTQ1_0 block in vector n); the activation quantizer writes each token's int8 activations in
// the same slot order (slot_map), zeros in padding slots, so the integer dot product of a block is
//   isum = sum_slots code * a_slot - off * asum_block
// and equals the element-order dot product exactly. AVX-512 handles a code vector as one zmm,
// AVX2 as two ymm halves.
//
// Per type (v = code vector, p = byte in it, e = element inside the unit):
//   PTQ1_0    G=2 C=5: p = 32g + k, v = trit n of block byte k (k < 26)
//   TQ1_0     G=1 C=5: p < 32: trit n of qs[p]; p >= 32: trit n of block byte 32 + (p - 32), < 52
//   TQ2_0     G=1 C=4: p = qs byte (0..63), v = 2-bit field l
//   Q2_0      G=4 C=4: p = 16g + k, v = 2-bit field l of qs[k]
//   Q2_0_G128, PQ2_0 G=2 C=4: p = 32g + k, v = 2-bit field l of qs[k]
//   Q4_0      G=4 C=2: p = 16g + k, v = 0 low nibble, 1 high nibble of qs[k]
//   Q8_0      G=2 C=1: p = 32g + k, signed qs[k]
// One-token AVX-512 variant (int8_layout_for): PTQ1_0 as above but p = 4 + k for block 0 and
// p = 32 + k for block 1, the bytes of one 64-byte load from 4 bytes before the unit (the 56-byte
// unit's two blocks then sit in the two halves without moving a byte).
// PTQ1_0_R16 (ptq1_0_r16.h), one token on AVX-512: G=1 C=3, 34 dwords used. Dword 5 k + n (k < 6,
// n < 5), byte i is the element of trit n of qs byte 4 k + i; dword 30 + f, byte i < 2 that of
// field f of re-coded qh byte i (element 120 + 2 f + i); the kernel broadcasts each dword to the 16
// rows of a tile; R16L the same (with VBMI). Every other path reads R16 and R16L weights converted
// back to PTQ1_0, so it gets PTQ1_0's layout.
// Q8_0_R4 (repack.h), one token on AVX-512: G=4 C=2. Byte p = 16 j + k of vector v is element
// 16 v + k of block j (the order of a tile row's two vectors); the blocks past the last group use
// Q8_0's units (`rest`).
#pragma once

#include <cstdint>

#include "bonsai/ops.h"
#include "bonsai/types.h"

namespace bonsai::cpu {

struct Int8Layout {
    int G;             // blocks per unit
    int C;             // 64-byte code vectors per unit
    int off;           // weight = code - off (0 for the signed Q8_0 codes)
    bool is_signed;    // codes are signed weights (Q8_0)
    int block_elems;   // elements per block
    int block_bytes;   // bytes per block
    int d_offset;      // byte offset of the fp16 scale inside the block
    const int16_t* slot_map;  // C*64 entries: element index inside the unit, or -1 for padding
    const Int8Layout* rest;   // layout of the blocks after the last full unit; nullptr: a partial unit
    // The slot map as dword gathers, where every 4 slots (a dword) hold consecutive elements or
    // padding (nullptr otherwise): slots 4j..4j+3 = elements gather_idx[j] + 0..3 of the unit, each
    // byte kept where gather_mask is 0xFF (C*16 indices, C*64 mask bytes).
    const int32_t* gather_idx;
    const uint8_t* gather_mask;
};

// Batches of up to tile_batch_tokens(type) tokens (several sequences decoding together) run on the
// AVX-512 path through the one-token tiles, each tile computed for every token while its rows are
// in L1 (matmul_int8_avx512_impl.h), instead of the GEMM, whose per-panel unpacking pays off only
// over more tokens: 8 for PTQ1_0_R16 and R16L, 4 for the others. On a Zen 4 (2 threads, 2048-wide weights),
// against the GEMM: 2 tokens took 0.43x its time for a 5632-row PTQ1_0 weight (then in the PTQ1_0_X8
// order) and 0.56x for a 32000-row Q8_0 head, 4 tokens 0.9x and 0.75x, and the head was even at 5
// and slower from 6 on; the PTQ1_0_R16 tiles took 0.6-0.8x the GEMM's time at 5 and 6 tokens, 0.9x
// at 8 and about the same at 12.
int64_t tile_batch_tokens(GgmlType type);

// Layout of a quantized type the INT8 kernels run; nullptr for anything else.
const Int8Layout* int8_layout(GgmlType type);
// The layout the kernel of `path` reads for n_tokens tokens: int8_layout(type), except the
// one-token AVX-512 variants of PTQ1_0, PTQ1_0_R16 and Q8_0_R4 (see above) for batches of up to
// tile_batch_tokens(type). A repacked type's int8_layout (repack.h) is its file type's. PTQ1_0_R16L
// shares R16's layout while AVX-512 VBMI is enabled (its code is read by VBMI lookups) and gets
// PTQ1_0's one-token layout otherwise.
const Int8Layout* int8_layout_for(GgmlType type, CpuPath path, int64_t n_tokens);
// Whether an AVX-512 kernel given `layout` reads repacked tiles themselves (the one-token layouts
// of PTQ1_0_R16 / R16L and Q8_0_R4); with any other layout, repacked weights are read converted back.
bool reads_repacked(const Int8Layout* layout);

}  // namespace bonsai::cpu
