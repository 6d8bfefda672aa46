// libFuzzer harness of the GGUF reader and the model loader (ASan + UBSan build, BONSAI_FUZZ=ON).
//
// Input: the bytes of a model file. The harness opens them with GgufFile (header, metadata,
// tensor directory, placement checks), renders every metadata value and the inspect summary,
// runs check_engine_types, then loads them as a Model (hyperparameters, tensor shapes and types,
// vocabulary) and, when that succeeds, decodes one token in a context of 8 cells.
//
// Property: every malformed input ends in a bonsai::Error. Anything else (another exception,
// an ASan or UBSan report, an allocation beyond -malloc_limit_mb) is a finding; lengths and
// counts read from the file must be capped by the file size before anything is allocated.
#include <cstdint>
#include <string>

#include "bonsai/context.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/inspect.h"
#include "bonsai/model.h"
#include "fuzz_common.h"

namespace {

void exercise_file(const std::string& path) {
    auto f = bonsai::GgufFile::open(path);
    size_t chars = 0;
    for (const bonsai::GgufKv& kv : f->metadata()) chars += kv.value.to_string().size() + kv.value.type_name().size();
    chars += bonsai::format_inspect(*f).size();
    if (chars == 0) std::abort();  // a header and the inspect summary always render something
    f->check_engine_types();
}

void exercise_model(const std::string& path) {
    bonsai::ModelParams mp;
    mp.n_gpu_layers = 0;
    auto model = bonsai::Model::load(path, mp);
    bonsai::ContextParams cp;
    cp.n_ctx = 8;
    cp.n_batch = 8;
    cp.n_threads = 1;
    bonsai::Context ctx(model, cp);
    bonsai::Batch b;
    b.add(0, 0, 0, true);
    ctx.decode(b);
    (void)ctx.logits(-1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static bonsai_fuzz::MemFile file("fuzz_gguf");
    const std::string& path = file.write(data, size);
    try {
        exercise_file(path);
    } catch (const bonsai::Error&) {
        return 0;  // refused by the reader: the model loader would refuse it the same way
    }
    try {
        exercise_model(path);
    } catch (const bonsai::Error&) {
    }
    return 0;
}
