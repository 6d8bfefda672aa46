"""A qwen35 model in the engine's runtime types (PTQ1_0 and Q8_0, converted from a tiny random
Qwen3.5 with widths the 128-wide ternary groups accept) through every front end: bonsai_run,
Llama and the server. Continuous batching must not mix the sequences' recurrent states (8 parallel
sequences give the greedy text of 8 single runs), and prompt-prefix reuse must give the text of a
cold run (the state resumes from its checkpoint, never from a position it cannot rebuild)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import bonsai_run_path
from qwen35_factory import make_qwen35_model
from test_bonsai_run_parallel import _outputs, _prompt_file
from test_convert import run_convert
from test_server import _Server

core = pytest.importorskip("bonsai_runner._core")

# every linear width a multiple of 128 (PTQ1_0 groups): hidden 128, attention 2 x 64, V 4 x 32
WIDE = dict(hidden_size=128, intermediate_size=256, head_dim=64, num_attention_heads=2, num_key_value_heads=1,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
PROMPTS = ["def add(a, b):", "The capital of", "1 2 3 4 5", "hello world hello", "import numpy as np",
           "a", "print('x')", "for i in range(10):"]
N_GEN = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35_run")
    make_qwen35_model(d / "hf", seed=3, **WIDE)
    out = {}
    for t in ("ptq1_0", "q8_0"):
        out[t] = str(run_convert(d / "hf", d / f"model-{t}.gguf", t, allow_lossy=True))
    return out


@pytest.fixture(params=["ptq1_0", "q8_0"])
def model(request, files):
    return files[request.param]


def _run(*args):
    p = subprocess.run([bonsai_run_path(), *map(str, args)], capture_output=True, timeout=300)
    p.stderr = p.stderr.decode("utf-8", "replace")
    return p


def test_file_types_and_layer_table(files):
    m = core.Model(files["ptq1_0"])
    assert m.arch == "qwen35"
    table = m.layer_table()
    assert table.count("GDN qkv PTQ1_0") == 3 and table.count("  q PTQ1_0") == 1, table


def test_bonsai_run_parallel_equals_single_runs(model, tmp_path):
    common = ("-m", model, "-n", N_GEN, "--temp", "0", "-t", "2", "-c", "512")
    for extra in [(), ("--cache-prompt", "-b", "5")]:
        p = _run(*common, "--parallel", "8", "-f", _prompt_file(tmp_path, PROMPTS), *extra)
        assert p.returncode == 0, p.stderr
        got = _outputs(p.stdout)
        assert sorted(got) == list(range(len(PROMPTS)))
        for i, prompt in enumerate(PROMPTS):
            single = _run(*common, "-p", prompt)
            assert single.returncode == 0, single.stderr
            assert got[i] == single.stdout, (extra, i)


def _greedy_tokens(ctx, ids, n, seq=0, start=0):
    out = []
    logits = ctx.decode(ids[start:], pos=list(range(start, len(ids))), seq_ids=[seq] * (len(ids) - start))
    for k in range(n):
        t = int(np.argmax(logits[-1]))
        out.append(t)
        logits = ctx.decode([t], pos=[len(ids) + k], seq_ids=[seq])
    return out


def test_context_prefix_reuse_and_seq_cp_are_exact(model):
    m = core.Model(model)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 300, 20)]
    cold = core.Context(m, n_ctx=256, n_seq_max=2)
    want = _greedy_tokens(cold, ids, 8)
    ctx = core.Context(m, n_ctx=256, n_seq_max=2)
    ctx.decode(ids[:14], seq_ids=[0] * 14)  # checkpoint at position 12
    assert ctx.seq_reusable(0, 14) == 14 and ctx.seq_reusable(0, 13) == 13 and ctx.seq_reusable(0, 9) == 0
    with pytest.raises(core.BonsaiError, match="cannot be rewound"):
        ctx.seq_rm(0, 9, -1)
    with pytest.raises(core.BonsaiError, match="only drop a tail"):
        ctx.seq_rm(0, 2, 5)
    ctx.seq_cp(0, 1, 0, 13)  # seq 1 resumes from seq 0's checkpoint
    assert _greedy_tokens(ctx, ids, 8, seq=1, start=13) == want
    ctx.seq_rm(0, 13, -1)  # back to the checkpoint
    assert _greedy_tokens(ctx, ids, 8, seq=0, start=13) == want
    with pytest.raises(core.BonsaiError, match="not empty"):
        ctx.seq_cp(0, 1)


def test_llama_api_prefix_reuse_equals_cold(model):
    from bonsai_runner import Llama

    # the same prompt again (resumes from the checkpoint before its last token), then a longer one
    # (back to that checkpoint too, since the first generation's tokens differ from the suffix)
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[0] + " return a"]
    cold_texts = []
    for p in prompts:
        cold = Llama(model, n_ctx=512, verbose=False, seed=1)
        cold_texts.append(cold(p, max_tokens=N_GEN, temperature=0)["choices"][0]["text"])
        cold.close()
    warm = Llama(model, n_ctx=512, verbose=False, seed=1)
    n = len(warm.tokenize(PROMPTS[0].encode()))
    warm_texts, reused = [], []
    for p in prompts:
        warm_texts.append(warm(p, max_tokens=N_GEN, temperature=0)["choices"][0]["text"])
        reused.append(warm._n_reused)
    warm.close()
    assert reused == [0, n - 1, n - 1]
    assert warm_texts == cold_texts


def test_server_concurrent_and_reused_equal_sequential(model):
    from bonsai_runner import Llama
    from bonsai_runner.server import ServingEngine

    ref = Llama(model, n_ctx=512, verbose=False)
    want = [ref(p, max_tokens=N_GEN, temperature=0)["choices"][0]["text"] for p in PROMPTS]
    ref.close()
    s = _Server(ServingEngine(model, n_parallel=8, n_ctx_slot=256, n_batch=16, n_threads=2))
    try:
        c = s.client()

        def one(p):
            return c.completions.create(model="x", prompt=p, max_tokens=N_GEN, temperature=0).choices[0].text

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            assert list(pool.map(one, PROMPTS)) == want
        reused = s.metric("bonsai_prompt_tokens_reused_total")
        assert [one(p) for p in PROMPTS] == want  # the second round reuses the checkpoints
        assert s.metric("bonsai_prompt_tokens_reused_total") > reused
        chat = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         temperature=0)
        assert chat.choices[0].message.role == "assistant"
    finally:
        s.stop()
