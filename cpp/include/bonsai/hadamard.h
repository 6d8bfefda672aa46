// The prism.hadamard rotation contract of Bonsai 2 files (SPEC §4a), read and validated from a
// GGUF file's metadata.
//
// Keys (prefix prism.hadamard.): version (1; absent together with every other key = no rotation),
// block_size B (a power of two), transform "normalized-sylvester-walsh-hadamard", axis
// "input-last-dimension", sign_mode "identity" | "explicit", weight_names (the folded linear
// weights: stored rows WHT_B(s ⊙ w) along the input), sign_widths + sign_values (explicit mode:
// one ±1 vector per distinct input width, concatenated in the order of the widths),
// inverse_weight_names (only token_embd.weight: rows stored as WHT_B(s ⊙ e), looked up as
// e = s ⊙ WHT_B(z)), and gdn_v_grouped (only meaningful for qwen35's ssm_out, which the
// architectures this engine runs do not have; read and ignored). Any other prism.hadamard.* key is
// refused: a newer contract must not run under the old rules. Every inconsistency is one
// bonsai::Error naming the key and the fix; the type id of a tensor says nothing about rotation,
// only these keys do.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bonsai/ops.h"

namespace bonsai {

class GgufFile;

struct HadamardContract {
    bool present = false;                          // the file declares a rotation
    int64_t block = 0;                             // B
    bool explicit_signs = false;                   // sign_mode explicit (else identity)
    std::map<int64_t, std::vector<float>> signs;   // width -> ±1 values (explicit mode)
    std::vector<std::string> weight_names;         // folded linear weights
    bool inverse_token_embd = false;               // token_embd.weight in inverse_weight_names
    bool gdn_v_grouped = false;

    // Reads and validates every key (names are checked against the model by Model::load).
    static HadamardContract read(const GgufFile& f);

    // The rotation of a folded input of `width` for the weight `name` (for error messages):
    // throws when the width is not a multiple of B or has no sign vector (explicit mode).
    Rotation rotation_for(const std::string& name, int64_t width) const;

    // Floats held for the sign vectors (counted in the model's memory).
    int64_t sign_floats() const;
};

}  // namespace bonsai
