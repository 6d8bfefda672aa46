#!/usr/bin/env bash
# Developer build without pip: configures build/dev (C++ tests on), builds the engine, bonsai_run,
# the C++ tests and the _core module, and copies _core next to the Python sources so that
#   PYTHONPATH=python PATH=build/dev:$PATH python -m pytest
# runs the suite against this checkout. Extra arguments go to cmake's configure step
# (e.g. -DBONSAI_CUDA=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BONSAI_DEV_BUILD:-build/dev}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBONSAI_BUILD_TESTS=ON \
  -DBONSAI_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" "$@" >/dev/null
cmake --build "$build" -j 2
# copy under a temporary name and rename, so processes that have the old module loaded keep it
for so in "$build"/_core*.so; do
  cp "$so" "python/bonsai_runner/.$(basename "$so").tmp"
  mv -f "python/bonsai_runner/.$(basename "$so").tmp" "python/bonsai_runner/$(basename "$so")"
done
echo "built $build; run: PYTHONPATH=python PATH=$build:\$PATH python3 -m pytest"
