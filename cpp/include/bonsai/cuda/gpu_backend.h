// The CUDA backend as seen from the engine (plain C++, no CUDA headers; defined only in
// BONSAI_CUDA builds, in cpp/backends/cuda/).
//
// Offload: the FIRST n layers of a model run on the GPU, the rest on the CPU; the output head
// (output_norm + output) is on the GPU only when every layer is. The token embedding stays on the
// host (one row per token is gathered there and uploaded), as does the rope cos/sin table.
//
// Memory: at Model load the offloaded weights are copied once, in their packed file layout, into
// ONE device allocation (GpuModel); every Context makes ONE more device allocation for the KV
// cache of the GPU layers and all GPU compute buffers (GpuContext). Nothing is allocated per token.
// Both requests are compared with cudaMemGetInfo's free memory first and refused with the numbers
// (needed vs free) before allocating. Device 0 is used.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace bonsai {

class Model;
struct ContextParams;
struct ForwardState;
class GpuModel;
class GpuContext;

struct GpuDeviceInfo {
    std::string name;
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
};
// Name and memory of device 0; throws bonsai::Error without a device.
GpuDeviceInfo cuda_device_info();

struct GpuWeightsMemory {
    int n_layers = 0;                             // offloaded layers (the first n_layers)
    bool output = false;                          // output_norm + output head on the GPU
    uint64_t weights_bytes = 0;                   // tensor bytes on the device (packed; 1-D as f32)
    std::map<std::string, uint64_t> bytes_by_type;  // type name -> bytes (1-D tensors under "F32")
    uint64_t allocated_bytes = 0;                 // the single allocation (tensors + 256-B alignment)
};

// Uploads the weights of layers [0, n_layers) (and the output head when `output`) of a loaded
// model. Throws (needed vs free) when they do not fit.
std::shared_ptr<const GpuModel> gpu_model_upload(const Model& m, int n_layers, bool output);
GpuWeightsMemory gpu_model_memory(const GpuModel& g);

struct GpuContextMemory {
    uint64_t kv_bytes = 0;       // K and V of the offloaded (attention) layers, n_ctx cells
    uint64_t recurrent_bytes = 0;  // qwen35: state of the offloaded GDN layers, n_seq_max sequences + checkpoints
    uint64_t compute_bytes = 0;  // activations, INT8 scratch, token / cell metadata, alignment
    uint64_t logits_bytes = 0;   // output rows of the head (when the head is on the GPU)
    uint64_t allocated_bytes = 0;  // the single allocation: the sum of the above
};

// What a context of these parameters allocates on the device (n_batch already clamped to n_ctx).
GpuContextMemory gpu_context_plan(const Model& m, const ContextParams& p);
// Allocates it; throws (needed vs free) when it does not fit.
std::shared_ptr<GpuContext> gpu_context_create(const Model& m, const ContextParams& p);
GpuContextMemory gpu_context_memory(const GpuContext& c);

// Runs one batch chunk's offloaded layers on the context's stream: uploads st.x (embeddings), the
// rope table and the token / cell metadata (through pinned staging), runs layers [0, n_gpu), then
// either copies x back (CPU layers follow) or runs the output head and copies the wanted logits
// into st.logits (in embeddings mode, st.embd set, it copies x back instead and skips the head).
// With ContextParams::cuda_graph, chunks of up to 64 tokens replay one captured
// CUDA graph per (n_tokens, n_out) shape (bit-identical to plain launches). Returns n_gpu.
int64_t gpu_forward(const Model& m, GpuContext& c, ForwardState& st);

// qwen35: RecurrentState's operations (bonsai/recurrent_state.h) on the device state of the
// offloaded GDN layers (live state and one checkpoint per sequence; the checkpoint positions are
// kept by the host RecurrentState). Each runs on the context's stream and waits for it, so it is
// ordered after the previous step and before the next. No-ops when no GDN layer is offloaded.
void gpu_state_reset(GpuContext& c, int seq);                  // live state zeroed
void gpu_state_copy(GpuContext& c, int src, int dst);          // live state and checkpoint
void gpu_state_save_checkpoint(GpuContext& c, int seq);        // checkpoint <- live
void gpu_state_restore_checkpoint(GpuContext& c, int seq);     // live <- checkpoint
void gpu_state_load_checkpoint_of(GpuContext& c, int src, int dst);  // dst's live and checkpoint <- src's checkpoint

}  // namespace bonsai
