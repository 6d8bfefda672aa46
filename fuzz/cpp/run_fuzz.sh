#!/usr/bin/env bash
# Runs the libFuzzer harnesses of fuzz/cpp (built by a BONSAI_FUZZ=ON configure) over their seed
# corpora, then replays every committed regression input of fuzz/cpp/regressions/<harness>/.
#
#   fuzz/cpp/run_fuzz.sh BUILD_DIR [HARNESS...] [-- LIBFUZZER_FLAGS...]
#
# BUILD_DIR holds fuzz_gguf, fuzz_vocab, fuzz_cli_args and fuzz_gbnf; HARNESS names a subset (default all).
# LIBFUZZER_FLAGS default to a CI smoke, -max_total_time=5; for a long run pass e.g.
# -- -runs=1000000. The seeds are regenerated into BUILD_DIR/seeds by make_seeds.py (needs numpy
# and gguf), the growing corpus is kept in BUILD_DIR/corpus/<harness>, crash inputs are written to
# BUILD_DIR/findings/. Exits non-zero on the first harness that finds a crash or fails a replay.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run_fuzz.sh BUILD_DIR [HARNESS...] [-- LIBFUZZER_FLAGS...]}
shift
harnesses=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do harnesses+=("$1"); shift; done
[ $# -gt 0 ] && shift
flags=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(fuzz_gguf fuzz_vocab fuzz_cli_args fuzz_gbnf)
[ ${#flags[@]} -eq 0 ] && flags=(-max_total_time=5)

python3 "$here/make_seeds.py" "$build/seeds" >/dev/null
mkdir -p "$build/findings"
# a single allocation above 512 MiB (a length field trusted before it is checked) is a finding
common=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1
        "-artifact_prefix=$build/findings/")
for h in "${harnesses[@]}"; do
  bin="$build/$h"
  [ -x "$bin" ] || { echo "run_fuzz.sh: $bin is missing; configure with -DBONSAI_FUZZ=ON and build" >&2; exit 1; }
  regressions="$here/regressions/$h"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    echo "== $h: replaying $(ls "$regressions" | wc -l) regression inputs"
    "$bin" "${common[@]}" "$regressions"/* 2>&1 | tail -n 1
  fi
  mkdir -p "$build/corpus/$h"
  echo "== $h ${flags[*]}"
  log="$build/findings/$h.log"
  if ! "$bin" "${common[@]}" "${flags[@]}" "$build/corpus/$h" "$build/seeds/$h" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "run_fuzz.sh: $h found a crash (input in $build/findings/, log $log)" >&2
    exit 1
  fi
  grep -E "^Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$log" || true
done
