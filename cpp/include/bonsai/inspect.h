// Human-readable summary of a GGUF file (`bonsai_run --inspect`): architecture, metadata, tensor
// table, totals per type and bits per weight. The Python `bonsai inspect` prints the same facts.
#pragma once

#include <string>

#include "bonsai/gguf.h"

namespace bonsai {

// Bits per weight of a set of tensors: bytes * 8 / elements, scales and padding-free block bytes
// included (what the file really spends per weight).
struct BpwSummary {
    double linear_bpw = 0;     // 2-D attn_q/k/v/output and ffn_gate/up/down weights of the blocks
    int64_t linear_elements = 0;
    uint64_t linear_bytes = 0;
    int linear_tensors = 0;
    double file_bpw = 0;       // file size * 8 / all tensor elements
    int64_t total_elements = 0;
};

// True for `blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight`.
bool is_linear_weight(const std::string& tensor_name);

BpwSummary compute_bpw(const GgufFile& f);

// The full report; `with_tensors` adds one line per tensor.
std::string format_inspect(const GgufFile& f, bool with_tensors = true);

}  // namespace bonsai
