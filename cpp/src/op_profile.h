// Per-op wall-clock profile of the forward pass: where a decode step spends its time.
//
// Off unless the environment variable BONSAI_PROFILE is set (to anything but "0") when the first
// scope is opened; while off, a scope costs one test of a cached flag and reads no clock. While
// on, every OpScope adds its wall time, and for matmuls the weight bytes it read, to the totals
// of its kind, kept apart for one-token batches (decode) and larger ones (prefill). At process
// exit the totals are printed to stderr: calls, milliseconds, microseconds per call, share of
// the profiled time and, for matmuls, the effective weight bandwidth in GB/s. Scopes are opened
// by the thread that runs the forward pass (one at a time), so the totals need no locking.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bonsai {

enum class OpKind : int {
    EMBED,      // token embedding lookup, rope table
    NORM,       // RMSNorm of the residual stream (attention, FFN and output norms)
    QKV,        // q/k/v projections (activation quantization included)
    ROPE_KV,    // rotary positions and the KV cache store
    ATTENTION,  // scores, softmax and the weighted values
    ATTN_OUT,   // attention output projection
    GATE_UP,    // FFN gate and up projections
    SWIGLU,     // silu(gate) * up
    DOWN,       // FFN down projection
    RESIDUAL,   // residual additions
    HEAD,       // output head
    COUNT
};

bool op_profile_on();

class OpScope {
public:
    OpScope(OpKind kind, int64_t n_tokens, size_t weight_bytes = 0);
    ~OpScope();
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

private:
    int64_t t0_ns_ = -1;  // -1: profiling off
    OpKind kind_;
    bool decode_;
    size_t bytes_;
};

}  // namespace bonsai
