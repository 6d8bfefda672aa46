"""CUDA graphs of whole forward steps (ContextParams::cuda_graph, cpp/backends/cuda/step_graphs.cu)
against plain launches (`pytest -m cuda`; skipped without a BONSAI_CUDA=ON build and a GPU).

A replayed graph runs the kernels and copies captured at the first step of its shape, with the
arguments of that step; it stays correct only if every per-step input reaches the device through
the fixed staging buffers and every count that changes (the cache's used cells) is read from
device memory. So logits with graphs on must be bit-identical to graphs off over steps that
change those inputs: a 20-step decode whose context grows, two sequences decoded together, and
shape changes (1 and 2 tokens, last vs all logits, a prefill chunk in between), for both
attention kernels and with the head on the GPU or on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from bonsai_runner import _core
from synthetic_gguf import write_synthetic_model

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs") / "llama-ptq1.gguf"
    write_synthetic_model(path, "llama", wtype="PTQ1_0", n_layer=2, seed=3)
    return str(path)


def _steps(path: str, ngl: int, cuda_graph: bool, flash: bool) -> list:
    rng = np.random.default_rng(11)
    tok = lambda k: [int(t) for t in rng.integers(3, 500, k)]  # noqa: E731
    out = []
    with _core.Model(path, n_gpu_layers=ngl) as m, \
            _core.Context(m, n_ctx=96, n_batch=16, n_seq_max=2, n_threads=2, flash_attn=flash,
                          cuda_graph=cuda_graph) as ctx:
        out.append(ctx.decode(tok(9), logits="all"))
        ctx.seq_cp(0, 1)
        for step in range(20):
            if step == 10:   # a prefill chunk of sequence 1 in the middle: another shape
                out.append(ctx.decode(tok(5), seq_ids=[1] * 5, logits="last"))
            if step % 3 == 2:
                out.append(ctx.decode(tok(1), seq_ids=[0]))
            else:
                out.append(ctx.decode(tok(2), seq_ids=[0, 1], logits="all"))
    return out


@pytest.mark.parametrize("flash", [False, True], ids=["plain", "flash"])
@pytest.mark.parametrize("ngl", [-1, 1], ids=["all-gpu", "head-on-cpu"])
def test_graphs_bit_identical_to_plain_launches(model_path, ngl, flash):
    on = _steps(model_path, ngl, True, flash)
    off = _steps(model_path, ngl, False, flash)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.shape == b.shape, f"step {i}: shapes {a.shape} vs {b.shape}"
        assert np.all(np.isfinite(a)), f"step {i}: non-finite logits with graphs"
        assert np.array_equal(a, b), f"step {i}: max diff {np.abs(a - b).max()} (graphs on vs off)"
