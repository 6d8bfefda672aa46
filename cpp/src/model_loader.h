// Typed, validated access to a model file's tensors while a Model is being built: every lookup
// checks presence, shape and type and throws one bonsai::Error naming the tensor and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bonsai/gguf.h"
#include "bonsai/model.h"
#include "bonsai/ops.h"

namespace bonsai {

class ModelLoader {
public:
    explicit ModelLoader(Model& m) : m_(m) {}

    const GgufFile& gguf() const { return *m_.gguf_; }
    bool has(const std::string& name) const;
    // A matrix of `rows` outputs by `cols` inputs (ggml ne = {cols, rows}) of a type with a kernel.
    WeightView matrix(const std::string& name, int64_t cols, int64_t rows);
    // A vector of n values of any type, converted to float32.
    std::vector<float> vector(const std::string& name, int64_t n);
    // A small 2-D tensor of ggml shape {ne0, ne1} of any type, converted to float32 (ne0 fastest).
    std::vector<float> floats_2d(const std::string& name, int64_t ne0, int64_t ne1);

private:
    const GgufTensor& tensor(const std::string& name) const;

    Model& m_;
};

}  // namespace bonsai
