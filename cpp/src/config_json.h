// The --config file of bonsai_run: a flat JSON object of string / number / boolean values, read
// by a minimal reader of our own (cli_args.cpp turns each key into its flag).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace bonsai {

// (key, value as command-line text) pairs in file order; booleans as "true"/"false". Throws
// bonsai::Error "--config PATH: <problem> at byte N; ..." on malformed input.
std::vector<std::pair<std::string, std::string>> read_config_object(const std::string& text, const std::string& path);

}  // namespace bonsai
