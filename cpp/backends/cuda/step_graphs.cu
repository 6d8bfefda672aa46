// See step_graphs.cuh. Capture uses cudaStreamCaptureModeThreadLocal: a synchronizing CUDA call
// from this thread during capture fails the capture (and is reported) instead of silently
// breaking the graph; any bonsai::Error thrown by an op while capturing ends the capture too.
#include "step_graphs.cuh"

#include <cstdio>

#include "bonsai/error.h"
#include "cuda_common.cuh"

namespace bonsai::cuda {

StepGraphs::~StepGraphs() {
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
}

void StepGraphs::disable(const char* why) {
    cudaGetLastError();  // the failure is handled here: do not report it at the next launch
    std::fprintf(stderr, "note: CUDA graph capture failed (%s); this context runs without CUDA graphs\n", why);
    enabled_ = false;
}

bool StepGraphs::run(uint64_t key, cudaStream_t s, const std::function<void()>& enqueue) {
    if (!enabled_) return false;
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
        if (it->first != key) continue;
        graphs_.splice(graphs_.begin(), graphs_, it);
        check(cudaGraphLaunch(graphs_.front().second, s), "CUDA graph launch");
        return true;
    }
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        disable(cudaGetErrorString(cudaGetLastError()));
        return false;
    }
    cudaGraph_t graph = nullptr;
    try {
        enqueue();
    } catch (const Error& e) {
        if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
        disable(e.what());
        return false;
    }
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (end != cudaSuccess || graph == nullptr) {
        disable(cudaGetErrorString(end));
        return false;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
        disable(cudaGetErrorString(inst));
        return false;
    }
    if (graphs_.size() >= kMaxGraphs) {
        cudaGraphExecDestroy(graphs_.back().second);
        graphs_.pop_back();
    }
    graphs_.emplace_front(key, exec);
    check(cudaGraphLaunch(exec, s), "CUDA graph launch");
    return true;
}

}  // namespace bonsai::cuda
