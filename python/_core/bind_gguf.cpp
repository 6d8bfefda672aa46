// PLACEHOLDER (being written): bind_gguf
#include "bind.h"
namespace bonsai_py {
void bind_gguf(pybind11::module_&) {}
}
