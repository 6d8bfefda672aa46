// PLACEHOLDER (being written): bind_quants
#include "bind.h"
namespace bonsai_py {
void bind_quants(pybind11::module_&) {}
}
