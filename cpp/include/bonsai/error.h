// The one exception type of the engine: a message that names the problem and, where there is
// one, the fix. The CLI prints it and exits non-zero; the binding maps it to a Python exception.
#pragma once

#include <stdexcept>
#include <string>

namespace bonsai {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace bonsai
