"""qwen35 on the CUDA backend: logits of the GPU path (Gated DeltaNet and gated attention layers
in cpp/backends/cuda/forward.cu) against the CPU engine for whole and partial offload, several
sequences interleaved in one batch, and prefix reuse through the recurrent-state checkpoint (the
device state of the offloaded GDN layers, cpp/backends/cuda/gpu_context.cu).

The model is the tiny random Qwen3.5 of tests/test_qwen35_run.py (4 layers: 3 GDN + 1 attention;
every linear width a multiple of 128), converted to Q8_0 and PTQ1_0. FLOAT activations for the
plumbing tests (where layers run, how state and activations cross), as test_cuda_engine.py does;
the INT8 test uses its bars. Every test is marked `cuda` (skipped without a device).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen35_factory import make_qwen35_model
from test_convert import run_convert
from test_cuda_engine import compare
from test_qwen35_run import _greedy_tokens as _greedy

core = pytest.importorskip("bonsai_runner._core")
cuda = pytest.mark.cuda

WIDE = dict(hidden_size=128, intermediate_size=256, head_dim=64, num_attention_heads=2, num_key_value_heads=1,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
N_LAYER = 4
TOKENS = [int(t) for t in np.random.default_rng(42).integers(3, 250, 24)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_qwen35")
    make_qwen35_model(d / "hf", seed=3, **WIDE)
    return {t: str(run_convert(d / "hf", d / f"model-{t}.gguf", t, allow_lossy=True)) for t in ("q8_0", "ptq1_0")}


def run_tokens(path: str, n_gpu_layers: int, act_mode: str = "float", steps: int = 6, **ctx_kw) -> np.ndarray:
    """Logits of a prompt (all rows) and `steps` single-token steps with fixed inputs."""
    with core.Model(path, n_gpu_layers=n_gpu_layers) as m:
        kw = dict(n_ctx=128, n_batch=64, n_threads=2, act_mode=act_mode)
        kw.update(ctx_kw)
        with core.Context(m, **kw) as ctx:
            rows = [ctx.decode(TOKENS, logits="all")]
            rng = np.random.default_rng(0)
            for _ in range(steps):
                rows.append(ctx.decode([int(rng.integers(3, m.n_vocab))]))
    return np.concatenate(rows)


@cuda
@pytest.mark.parametrize("wtype", ["q8_0", "ptq1_0"])
@pytest.mark.parametrize("ngl", [-1, 1, 2, 3])
def test_logits_match_cpu(files, wtype, ngl):
    path = files[wtype]
    with core.Model(path, n_gpu_layers=ngl) as m:
        expect = N_LAYER if ngl < 0 else ngl
        assert m.n_gpu_layers == expect
        assert m.memory_report()["gpu_output"] == (expect == N_LAYER)
    compare(f"qwen35 {wtype} ngl={ngl}", run_tokens(path, 0), run_tokens(path, ngl))


@cuda
@pytest.mark.parametrize("ngl", [-1, 2])
def test_logits_match_cpu_int8_small_batches(files, ngl):
    # chunks of 5 tokens: the state crosses chunk boundaries on the device
    path = files["q8_0"]
    compare(f"qwen35 int8 ngl={ngl}", run_tokens(path, 0, "int8", n_batch=5), run_tokens(path, ngl, "int8", n_batch=5))


def _interleaved(path: str, ngl: int) -> np.ndarray:
    """Three sequences' prompts interleaved token by token in one batch, then one step each."""
    prompts = [TOKENS[:9], TOKENS[5:16], TOKENS[10:17]]
    with core.Model(path, n_gpu_layers=ngl) as m, core.Context(m, n_ctx=128, n_batch=64, n_seq_max=3,
                                                                n_threads=2, act_mode="float") as ctx:
        toks, pos, seqs = [], [], []
        for i in range(max(map(len, prompts))):
            for s, p in enumerate(prompts):
                if i < len(p):
                    toks.append(p[i])
                    pos.append(i)
                    seqs.append(s)
        rows = [ctx.decode(toks, pos=pos, seq_ids=seqs, logits="all")]
        rows.append(ctx.decode([7, 8, 9], pos=[len(p) for p in prompts], seq_ids=[0, 1, 2], logits="all"))
    return np.concatenate(rows)


@cuda
@pytest.mark.parametrize("ngl", [-1, 2])
def test_interleaved_sequences_match_cpu(files, ngl):
    path = files["q8_0"]
    compare(f"qwen35 interleaved ngl={ngl}", _interleaved(path, 0), _interleaved(path, ngl))



@cuda
@pytest.mark.parametrize("ngl", [-1, 2])
def test_prefix_reuse_through_checkpoint(files, ngl):
    # the same sequence of operations as test_qwen35_run.py's CPU test, with the GDN state of the
    # offloaded layers on the device: checkpoint, seq_cp from it, seq_rm back to it, clear
    ids = TOKENS[:20]
    with core.Model(files["q8_0"], n_gpu_layers=ngl) as m:
        kw = dict(n_ctx=256, n_seq_max=2, n_threads=2, act_mode="float")
        with core.Context(m, **kw) as cold:
            want = _greedy(cold, ids, 8)
        with core.Context(m, **kw) as ctx:
            ctx.decode(ids[:14], seq_ids=[0] * 14)  # checkpoint at position 12
            assert ctx.seq_reusable(0, 14) == 14 and ctx.seq_reusable(0, 13) == 13
            ctx.seq_cp(0, 1, 0, 13)  # seq 1 resumes from seq 0's checkpoint
            assert _greedy(ctx, ids, 8, seq=1, start=13) == want
            ctx.seq_rm(0, 13, -1)  # back to the checkpoint
            assert _greedy(ctx, ids, 8, seq=0, start=13) == want
            ctx.seq_rm(1, -1, -1)
            ctx.seq_cp(0, 1)  # whole copy of live state and checkpoint
            ctx.seq_rm(1, 13, -1)
            assert _greedy(ctx, ids, 8, seq=1, start=13) == want
            ctx.clear()
            assert _greedy(ctx, ids, 8) == want
    # and the GPU agrees with the CPU's greedy text
    with core.Model(files["q8_0"], n_gpu_layers=0) as m, core.Context(m, n_ctx=256, n_threads=2,
                                                                      act_mode="float") as ctx:
        assert _greedy(ctx, ids, 8) == want


@cuda
@pytest.mark.parametrize("ngl", [-1, 2])
def test_memory_report_has_device_state(files, ngl):
    with core.Model(files["q8_0"], n_gpu_layers=ngl) as m, core.Context(m, n_ctx=128, n_seq_max=2) as ctx:
        cm = ctx.memory_report()
        n_gdn_gpu = 3 if ngl < 0 else 2  # layers 0..2 are GDN, layer 3 attention
        assert cm["gpu_recurrent_bytes"] > 0
        assert cm["gpu_allocated_bytes"] == (cm["gpu_kv_bytes"] + cm["gpu_recurrent_bytes"] + cm["gpu_compute_bytes"]
                                             + cm["gpu_logits_bytes"])
        assert (cm["gpu_kv_bytes"] > 0) == (ngl < 0) and (cm["kv_bytes"] > 0) == (ngl >= 0)
        host_gdn = 3 - n_gdn_gpu
        assert (cm["recurrent_bytes"] > 0) == (host_gdn > 0)
