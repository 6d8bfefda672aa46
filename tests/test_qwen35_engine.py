"""The engine runs converted qwen35 files like transformers runs the Hugging Face model (SPEC §6a).

Files: the tiny random Qwen3.5 of tests/qwen35_factory.py (tied and untied output head) converted
to F32 by this project's converter and, in the `slow` cases, by upstream llama.cpp's converter
(test_qwen35_convert.py fetches it). Checks, with float activations (act_mode "float"):
- all-position logits of one prompt against transformers' float64 forward: max |diff| <= 1e-3 x
  std(logits) and the same top-1 token at every position; the prompt decoded whole and in chunks
  of 5 tokens (the GDN conv window and delta state carried across decode calls);
- a 16-token greedy continuation decoded one token at a time equals transformers' greedy path and
  llama-cpp-python's (upstream llama.cpp, same file; skipped when it is not installed).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from test_qwen35_convert import (convert_ours, convert_upstream, qwen35,  # noqa: F401 (fixtures)
                                 upstream_vendor)

torch = pytest.importorskip("torch")
_core = pytest.importorskip("bonsai_runner._core")

PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 120, 64, 11, 200, 33, 1, 2, 90, 300, 301, 5, 5]
GREEDY_PROMPT, N_GREEDY = PROMPT[:8], 16


def hf_logits(m: dict, ids: list[int]) -> np.ndarray:
    model = copy.deepcopy(m["model"]).double()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def hf_greedy(m: dict, ids: list[int], n: int) -> list[int]:
    model = copy.deepcopy(m["model"]).double()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def gguf_file(qwen35, tmp_path_factory):  # noqa: F811 (fixture imported above)
    """gguf_file(tied, vendor=None) -> path of the F32 file: this project's converter, or
    upstream's when `vendor` (its vendor/llama.cpp) is given."""
    cache: dict = {}

    def get(tied: bool, vendor=None):
        key = (tied, vendor is not None)
        if key not in cache:
            m = qwen35(tied=tied)
            out = tmp_path_factory.mktemp("qwen35_gguf") / "m.gguf"
            if vendor is None:
                convert_ours(m, out, "f32")
            else:
                convert_upstream(vendor, m, out, "f32", "--no-mtp")
            cache[key] = out
        return cache[key]

    return get


SOURCES = [pytest.param("ours", id="ours"),
           pytest.param("upstream", id="upstream", marks=pytest.mark.slow)]


def file_for(request, gguf_file, source: str, tied: bool):
    vendor = request.getfixturevalue("upstream_vendor") if source == "upstream" else None
    return gguf_file(tied, vendor)


def engine_logits(path, ids, n_batch=64) -> np.ndarray:
    with _core.Model(str(path)) as model, _core.Context(model, n_ctx=128, n_batch=n_batch,
                                                       n_threads=2, act_mode="float") as ctx:
        parts = [ctx.decode(ids[i:i + n_batch], logits="all")
                 for i in range(0, len(ids), n_batch)]
    return np.concatenate(parts).astype(np.float64)


def engine_greedy(path, ids, n) -> list[int]:
    out = []
    with _core.Model(str(path)) as model, _core.Context(model, n_ctx=128, n_batch=64,
                                                       n_threads=2, act_mode="float") as ctx:
        logits = ctx.decode(ids, logits="last")
        for _ in range(n):
            tok = int(np.argmax(np.asarray(logits).reshape(-1)))
            out.append(tok)
            logits = ctx.decode([tok], logits="last")
    return out


@pytest.mark.parametrize("n_batch", [64, 5])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("source", SOURCES)
def test_engine_logits_match_transformers(request, qwen35, gguf_file, source, tied,  # noqa: F811
                                          n_batch):
    m = qwen35(tied=tied)
    want = hf_logits(m, PROMPT)
    got = engine_logits(file_for(request, gguf_file, source, tied), PROMPT, n_batch)
    assert got.shape == want.shape
    std = want.std()
    err = np.abs(got - want).max()
    assert err <= 1e-3 * std, f"max |diff| {err:.3g} = {err / std:.3g} x std"
    assert np.array_equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_matches_transformers_and_llama_cpp(request, qwen35,  # noqa: F811
                                                              gguf_file, source, tied):
    m = qwen35(tied=tied)
    path = file_for(request, gguf_file, source, tied)
    got = engine_greedy(path, GREEDY_PROMPT, N_GREEDY)
    assert got == hf_greedy(m, GREEDY_PROMPT, N_GREEDY)
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    try:
        ids, theirs = list(GREEDY_PROMPT), []
        llm.eval(ids)
        for _ in range(N_GREEDY):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            theirs.append(tok)
            llm.eval([tok])
    finally:
        llm.close()
    assert got == theirs
