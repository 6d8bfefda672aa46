"""Shared driver of the Python-reader fuzzers: atheris when fuzzing, a plain replay otherwise.

    python fuzz/python/fuzz_gguf.py [libFuzzer flags] CORPUS_DIR...   # fuzz (needs `atheris`)
    python fuzz/python/fuzz_gguf.py --replay FILE_OR_DIR...            # run inputs once, no atheris

A harness gives `main` its one-input function; the input may raise BonsaiError (the reader's one
error type for bad input) and nothing else: any other exception propagates, which atheris reports
as a crash and saves as crash-<sha1> (replay exits 1 and names the input).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "python") not in sys.path:  # a fallback: an installed bonsai_runner (CI) wins
    sys.path.append(str(ROOT / "python"))


def scratch_dir() -> Path:
    """A per-process temporary directory for the files an input is written to."""
    d = Path(tempfile.mkdtemp(prefix="bonsai-fuzz-"))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, d, True)
    return d


def expect_bonsai_error(fn: Callable[[], object]) -> None:
    from bonsai_runner.errors import BonsaiError

    try:
        fn()
    except BonsaiError:
        pass


def _replay(one_input: Callable[[bytes], None], paths: list[str]) -> int:
    files = [p for a in paths for p in (sorted(Path(a).iterdir()) if Path(a).is_dir() else [Path(a)])]
    for p in files:
        try:
            one_input(p.read_bytes())
        except Exception:
            print(f"CRASH on {p}", file=sys.stderr)
            raise
    print(f"replayed {len(files)} inputs: no crash")
    return 0


def main(one_input: Callable[[bytes], None], instrumented_imports: Callable[[], None]) -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--replay":
        instrumented_imports()
        sys.exit(_replay(one_input, sys.argv[2:]))
    import atheris

    with atheris.instrument_imports(include=["bonsai_runner"]):
        instrumented_imports()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
