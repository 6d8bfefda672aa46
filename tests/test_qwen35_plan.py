"""`bonsai plan` for the qwen35 hybrid: KV cache for the attention blocks only, plus the recurrent
state (per sequence and GDN block: conv window (kernel - 1) x conv_dim and delta state V heads x
dv x dk, float32, held twice: live + one checkpoint), shown on its own line. Checked on the tiny
Qwen3.5 of tests/qwen35_factory.py, from the converted GGUF and from its config.json, and (when the
engine is built) against what the engine allocates."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from test_qwen35_convert import convert_ours, qwen35  # noqa: F401 (fixture)

from bonsai_runner.plan import PlanParams, device_budgets, make_plan
from bonsai_runner.plan_model import describe_gguf, describe_hf
from bonsai_runner.ggml_types import type_info


def expected(cfg: dict, n_ctx: int, n_seq: int, type_k="f16", type_v="f16") -> dict:
    """The plan's formulas written out from the Hugging Face config."""
    n_attn = cfg["layer_types"].count("full_attention")
    n_gdn = cfg["layer_types"].count("linear_attention")
    n_kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv_dim = 2 * n_k * dk + n_v * dv
    per_seq = n_gdn * ((K - 1) * conv_dim + n_v * dv * dk)
    row = type_info(type_k).row_bytes(n_kv) + type_info(type_v).row_bytes(n_kv)
    return {"kv": n_ctx * n_attn * row, "recurrent": 2 * 4 * n_seq * per_seq}


@pytest.fixture(scope="module")
def qwen35_gguf(qwen35, tmp_path_factory):  # noqa: F811
    m = qwen35()
    out = tmp_path_factory.mktemp("qwen35_plan") / "m.gguf"
    convert_ours(m, out, "f16")
    return m, out


@pytest.mark.parametrize("n_seq", [1, 3])
def test_plan_counts_kv_for_attention_layers_and_the_recurrent_state(qwen35_gguf, n_seq):
    m, path = qwen35_gguf
    cfg = m["text_config"]
    d = describe_gguf(path)
    assert (d.arch, d.n_kv_layer, d.n_state_layer) == ("qwen35", 1, 3)
    assert d.n_rot == 8
    n_ctx = 256 * n_seq
    cpu = device_budgets(d, PlanParams(n_ctx=n_ctx, n_parallel=n_seq, n_threads=2))["CPU"]
    want = expected(cfg, n_ctx, n_seq)
    assert cpu["kv_bytes"] == want["kv"]
    assert cpu["recurrent_bytes"] == want["recurrent"]
    # (3 GDN layers x ((4 - 1) x 128 + 4 x 16 x 16) floats) x 4 bytes x 2 copies per sequence
    assert want["recurrent"] == n_seq * 2 * 4 * 3 * (3 * 128 + 4 * 16 * 16)
    assert cpu["total_bytes"] >= cpu["kv_bytes"] + cpu["recurrent_bytes"] + cpu["weights_bytes"]


def test_plan_from_config_equals_plan_from_file(qwen35_gguf):
    m, path = qwen35_gguf
    p = PlanParams(n_ctx=512, n_parallel=2, n_threads=2)
    a = device_budgets(describe_gguf(path), p)["CPU"]
    b = device_budgets(describe_hf(m["dir"], outtype="f16"), p)["CPU"]
    for k in ("weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes", "logits_bytes"):
        assert a[k] == b[k], k
    assert a["weights_by_type"] == b["weights_by_type"]


def test_cli_shows_the_recurrent_state_line(qwen35_gguf):
    _, path = qwen35_gguf
    r = run_cli("plan", path, "--ctx-size", "256", "--parallel", "2", "--threads", "2")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("recurrent state")]
    assert len(lines) == 1, r.stdout
    assert "3 GDN layers" in lines[0]
    assert any(ln.startswith("KV cache (f16/f16, 1 attention layer)") for ln in r.stdout.splitlines())
    j = run_cli("plan", path, "--ctx-size", "256", "--parallel", "2", "--threads", "2", "--json")
    plan = json.loads(j.stdout)
    assert plan["devices"]["CPU"]["recurrent_bytes"] == 2 * 2 * 4 * 3 * (3 * 128 + 4 * 16 * 16)
    assert (plan["model"]["n_kv_layer"], plan["model"]["n_recurrent_layer"]) == (1, 3)


def test_dense_plans_have_no_recurrent_line(hf_model, tmp_path):
    d = describe_hf(hf_model(arch="qwen3")["dir"], outtype="f16")
    plan = make_plan(d, PlanParams(n_ctx=128, n_threads=2))
    assert plan["devices"]["CPU"]["recurrent_bytes"] == 0
    assert d.n_kv_layer == d.n_layer


@pytest.mark.parametrize("n_seq", [1, 2])
def test_plan_agrees_with_the_engine(qwen35_gguf, n_seq):
    _core = pytest.importorskip("bonsai_runner._core")
    _, path = qwen35_gguf
    p = PlanParams(n_ctx=128 * n_seq, n_batch=64, n_parallel=n_seq, n_threads=2)
    cpu = device_budgets(describe_gguf(path), p)["CPU"]
    with _core.Model(str(path)) as model, _core.Context(
            model, n_ctx=p.n_ctx, n_batch=p.n_batch, n_seq_max=n_seq, n_threads=2) as ctx:
        mm, cm = model.memory_report(), ctx.memory_report()
    assert cpu["weights_bytes"] == pytest.approx(mm["weights_bytes"], rel=0.05)
    assert cpu["kv_bytes"] == cm["kv_bytes"]
    assert cpu["recurrent_bytes"] == cm["recurrent_bytes"]
    assert cpu["compute_bytes"] == cm["compute_bytes"]
    assert cpu["logits_bytes"] == cm["logits_bytes"]
