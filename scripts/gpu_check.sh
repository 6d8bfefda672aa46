#!/usr/bin/env bash
# The one command a session with an NVIDIA GPU runs: build bonsai-runner with the CUDA backend for
# the local GPU, run the C++ tests and the CUDA test suite (pytest -m cuda), and write a summary
# and the logs under $OUT (or build/gpu_check when OUT is unset).
#
# Works offline: it builds with --no-build-isolation, so scikit-build-core, pybind11, cmake, ninja,
# numpy and pytest must already be installed (they are on the lent H200 image). Pure-Python
# dependencies that are missing there (gguf) may be carried as wheels in .whl/ (see the device
# notes); they are installed into /tmp/site first when present.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
  >"$out/gpu.txt" 2>&1
note "gpu: $(cat "$out/gpu.txt")"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
arch=${arch:-90}
note "building for sm_$arch"

jobs=$(nproc)
start=$(date +%s)
if cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBONSAI_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBONSAI_BUILD_TESTS=ON -DBONSAI_BUILD_PYTHON=ON \
     -DPython_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
     >"$out/build.log" 2>&1 && cmake --build build/gpu -j "$jobs" >>"$out/build.log" 2>&1; then
  note "build: ok ($(( $(date +%s) - start )) s)"
else
  note "build: FAILED (see build.log)"
  tail -40 "$out/build.log"
  exit 1
fi
cp build/gpu/_core*.so python/bonsai_runner/

status=0
if ctest --test-dir build/gpu --output-on-failure >"$out/ctest.log" 2>&1; then
  note "ctest: ok ($(grep -c 'Test #' "$out/ctest.log") tests)"
else
  note "ctest: FAILED"; status=1
fi

PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} PATH=build/gpu:$PATH \
  python3 -m pytest -m cuda -v -p no:cacheprovider tests >"$out/pytest_cuda.log" 2>&1
rc=$?
note "pytest -m cuda: $(tail -1 "$out/pytest_cuda.log") (exit $rc)"
[ $rc -eq 0 ] || status=1

if [ -f benchmarks/bench_gpu.py ]; then
  PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} timeout 240 python3 benchmarks/bench_gpu.py \
    >"$out/bench_gpu.txt" 2>&1 && note "benchmark: see bench_gpu.txt" || note "benchmark: FAILED"
fi

exit $status
