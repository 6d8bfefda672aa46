"""Real-model check of `bonsai perplexity`: on the F16 conversion of Qwen2.5-Coder-0.5B-Instruct, the
per-token NLL of one chunk of the built-in evaluation text matches the same chunk scored from
llama-cpp-python's logits (upstream llama.cpp running the same file)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cli
from real_model import real_model_path  # noqa: F401  (session fixture)

pytestmark = pytest.mark.real_model
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

CTX = 256


@pytest.fixture(scope="module")
def f16(real_model_path, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("eval_real") / "qwen-f16.gguf"
    run_cli("convert", real_model_path, "--outfile", out, "--outtype", "f16", "--allow-lossy",
            check=True, timeout=900)
    return out


def test_perplexity_matches_llama_cpp(f16):
    from bonsai_runner.eval.perplexity import (PerplexityOptions, default_eval_file,
                                               run_perplexity)

    res = run_perplexity(PerplexityOptions(model=str(f16), ctx_size=CTX, chunks=1,
                                           act_mode="float"), lambda s: None, lambda s: None)
    text = open(default_eval_file(), encoding="utf-8").read()
    llm = llama_cpp.Llama(model_path=str(f16), n_ctx=CTX, n_batch=CTX, logits_all=True,
                          verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=False)[:CTX]
    llm.eval(tokens)
    x = np.array(llm.scores[:CTX], dtype=np.float64)[CTX // 2:CTX - 1]
    llm.close()
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    nll = lse - x[np.arange(x.shape[0]), np.asarray(tokens[CTX // 2 + 1:])]
    assert res.nll.size == nll.size
    np.testing.assert_allclose(res.nll, nll, atol=0.05, rtol=0.02)
    assert res.ppl == pytest.approx(float(np.exp(nll.mean())), rel=0.01)
