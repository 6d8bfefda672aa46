// CUDA graphs of whole forward steps (ContextParams::cuda_graph): the work of one step, enqueued on
// the context's stream, is captured once per shape key and replayed for every later step of that
// shape. A replay is valid because everything that changes between steps of one shape lives in
// memory whose address never changes: the host writes the step's inputs into pinned staging
// buffers that the captured copies read, and kernels read the counts that vary (the cache's used
// cells) from device memory (see forward.cu).
//
// Graphs are captured lazily, at the first step of a shape; at most kMaxGraphs are cached (the
// least recently used is dropped). When capture or instantiation fails, the set notes it once
// on stderr and turns itself off; the caller then runs the step with plain launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <list>
#include <utility>

namespace bonsai::cuda {

class StepGraphs {
public:
    static constexpr size_t kMaxGraphs = 8;

    StepGraphs() = default;
    ~StepGraphs();
    StepGraphs(const StepGraphs&) = delete;
    StepGraphs& operator=(const StepGraphs&) = delete;

    void set_enabled(bool on) { enabled_ = on; }
    bool enabled() const { return enabled_; }
    size_t cached() const { return graphs_.size(); }

    // Replays the graph of `key` on `stream`, capturing `enqueue` first when there is none.
    // Returns false (nothing enqueued) when graphs are off or capture failed: run `enqueue` plainly.
    bool run(uint64_t key, cudaStream_t stream, const std::function<void()>& enqueue);

private:
    void disable(const char* why);

    bool enabled_ = false;
    std::list<std::pair<uint64_t, cudaGraphExec_t>> graphs_;  // most recently used first
};

}  // namespace bonsai::cuda
