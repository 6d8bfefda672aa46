// Whole-file reads of the small inputs a user names on the command line (a prompt file, a --config
// JSON, a tokenizer.model), with one clear bonsai::Error for each way the path can be wrong: missing,
// unreadable or a directory (a pipe or device such as /dev/stdin is read like a file). (Model files are mapped instead, see
// mapped_file.h.)
#pragma once

#include <cstddef>
#include <cstddef>
#include <string>

namespace bonsai {

// The bytes of the file at `path`. `what` names the input in messages ("the prompt file") and
// `flag` the option that gave it ("-f"), e.g. "the prompt file '/tmp' is a directory; give -f the
// path of a file". More than max_bytes is an error (so `--config /dev/zero` ends instead of
// exhausting memory).
std::string read_input_file(const std::string& path, const std::string& what, const std::string& flag,
                            size_t max_bytes);

}  // namespace bonsai
