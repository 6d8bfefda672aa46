#!/usr/bin/env bash
# The one command a session with an NVIDIA GPU runs: build bonsai-runner with the CUDA backend for
# the local GPU, run the C++ tests and the CUDA test suite (pytest -m cuda: every op x type against
# the CPU, whole-model logits CPU vs GPU for all architectures and weight types, partial offload,
# multi-sequence batches, KV types, device memory vs cudaMemGetInfo, refusals, flash attention,
# CUDA graphs on vs off, qwen35's Gated DeltaNet ops), run a short GPU benchmark
# (benchmarks/bench_gpu.py --quick: the 8B shape's decode with graphs on / off, 8 parallel
# sequences, prefill flash vs plain, against a measured copy-bandwidth roofline), and write a
# summary and the logs under $OUT (or build/gpu_check when OUT is unset).
#
# Budget: about 8 minutes on an H200 machine with 16 cores (build ~2-3 min, tests ~2 min,
# benchmark ~1-2 min). The whole script stays inside GPU_CHECK_BUDGET seconds (default 470, so that
# it fits a 10-minute device command with room for the machine's start): every stage's timeout is
# the smaller of its own cap and what is left of the budget, so the summary is always written.
#
# Works offline: it builds with --no-build-isolation tools already installed (scikit-build-core,
# pybind11, cmake, ninja, numpy and pytest are on the lent H200 image). The CUDA tests need only
# numpy and pytest; pure-Python wheels carried in .whl/ (gguf, for the older dequantize tests) are
# installed into /tmp/site first when present.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
budget=${GPU_CHECK_BUDGET:-470}
# limit CAP RESERVE: seconds for the next stage, at most CAP, leaving RESERVE for the stages after it
limit() {
  local left=$(( budget - ($(date +%s) - t0) - $2 ))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 1 ] && left=1
  echo "$left"
}
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# $OUT brings back at most 8 files: summary.txt, build.log, ctest.log, three pytest logs (ops, engine,
# quants),
# bench_gpu.json and bench_gpu.log; everything else goes to the summary or to a scratch folder
tmp=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
  >"$tmp/gpu.txt" 2>&1
note "gpu: $(cat "$tmp/gpu.txt")"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
arch=${arch:-90}
note "building for sm_$arch"

jobs=$(nproc)
if timeout "$(limit 120 300)" cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBONSAI_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBONSAI_BUILD_TESTS=ON -DBONSAI_BUILD_PYTHON=ON \
     -DPython_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
     >"$out/build.log" 2>&1 && timeout "$(limit 330 150)" cmake --build build/gpu -j "$jobs" >>"$out/build.log" 2>&1; then
  note "build: ok ($(elapsed); $(grep -c 'warning' "$out/build.log") warning lines)"
else
  note "build: FAILED after $(elapsed) (see build.log)"
  grep -n -m 20 -E 'error|Error' "$out/build.log" | tee -a "$summary"
  exit 1
fi
cp build/gpu/_core*.so python/bonsai_runner/

status=0
if timeout "$(limit 60 140)" ctest --test-dir build/gpu --output-on-failure >"$out/ctest.log" 2>&1; then
  note "ctest: ok ($(grep -c 'Test #' "$out/ctest.log") tests, $(elapsed))"
else
  note "ctest: FAILED"; status=1
  grep -E 'Failed|CHECK failed' "$out/ctest.log" | head -20 | tee -a "$summary"
fi

export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} PATH=build/gpu:$PATH
if ! python3 -c "from bonsai_runner import _core; print('device:', _core.cuda_device_count(), _core.cuda_memory_info())" \
     >>"$summary" 2>&1; then
  note "no CUDA device is visible to the engine: every CUDA test below will be skipped"; status=1
fi
tail -1 "$summary"

# one pytest process per group, op-level parity first: a kernel fault poisons its CUDA context, so
# a crash in one group cannot hide the results of the next
for f in ops engine quants; do
  case $f in
    ops) files="tests/test_cuda_ops.py tests/test_cuda_flash.py tests/test_cuda_gdn_ops.py" cap=120 reserve=150 ;;
    engine) files="tests/test_cuda_engine.py tests/test_cuda_graphs.py tests/test_cuda_qwen35.py" cap=240 reserve=75 ;;
    *) files="tests/test_quants.py" cap=60 reserve=60 ;;
  esac
  # shellcheck disable=SC2086
  timeout "$(limit $cap $reserve)" python3 -m pytest -m cuda -v -rfE -p no:cacheprovider --durations=5 $files \
    >"$out/pytest_$f.log" 2>&1
  rc=$?
  note "pytest -m cuda $files: $(tail -1 "$out/pytest_$f.log") (exit $rc, $(elapsed))"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E '^(FAILED|ERROR) ' "$out/pytest_$f.log" | head -30 | tee -a "$summary"
  fi
done

if timeout "$(limit 200 0)" python3 benchmarks/bench_gpu.py --quick --json "$out/bench_gpu.json" >"$tmp/bench_gpu.txt" \
     2>"$out/bench_gpu.log"; then
  note "benchmark ($(elapsed)):"
  tee -a "$summary" "$out/bench_gpu.log" <"$tmp/bench_gpu.txt"
else
  note "benchmark: FAILED or timed out after $(elapsed) (see bench_gpu.log)"
  tail -5 "$out/bench_gpu.log" | tee -a "$summary"
fi

note "total: $(elapsed); status $status"
exit $status
