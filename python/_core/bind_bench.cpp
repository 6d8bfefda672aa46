// Binding of the benchmark helpers: _core.measure_read_bandwidth (cpp/src/bandwidth.cpp).
#include <pybind11/pybind11.h>

#include "bind.h"
#include "bonsai/bandwidth.h"

namespace py = pybind11;

namespace bonsai_py {

void bind_bench(py::module_& m) {
    m.def("measure_read_bandwidth", [](uint64_t buffer_bytes, int n_threads, int repeats) {
              bonsai::BandwidthResult r;
              {
                  py::gil_scoped_release release;
                  r = bonsai::measure_read_bandwidth(buffer_bytes, n_threads, repeats);
              }
              py::dict d;
              d["bytes_per_s"] = r.bytes_per_s;
              d["mean_bytes_per_s"] = r.mean_bytes_per_s;
              d["buffer_bytes"] = r.buffer_bytes;
              d["n_threads"] = r.n_threads;
              d["repeats"] = r.repeats;
              return d;
          },
          py::arg("buffer_bytes") = uint64_t{256} << 20, py::arg("n_threads") = 0, py::arg("repeats") = 5,
          "Streams a buffer larger than the caches with n_threads threads (0 = all); returns the best "
          "and mean read rate in bytes/s.");
}

}  // namespace bonsai_py
