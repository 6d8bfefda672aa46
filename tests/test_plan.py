"""`bonsai plan` against the engine: the planner's CPU figures must match what the engine reports
it allocated (Model.memory_report() + Context.memory_report()) for the same settings, on tiny
models of several architectures, weight types, contexts, KV types and parallel sequence counts;
a plan from a config.json must match the file the converter makes from it; the CLI and its
errors."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from engine_fixtures import Cfg, write_model

from bonsai_runner import _core
from bonsai_runner.errors import BonsaiError
from bonsai_runner.plan import (PlanParams, device_budgets, format_plan, largest_context,
                                make_plan, parse_bandwidth, parse_size)
from bonsai_runner.plan_model import describe, describe_gguf, describe_preset

# (fixture shape, context settings): several archs, weight/embedding types, contexts, KV types.
CASES = [
    (Cfg(arch="llama", wtype="F32", emb_type="F32"), dict(n_ctx=64, n_batch=16)),
    (Cfg(arch="llama", wtype="Q8_0", emb_type="F16", n_layer=3, n_ff=96, head_dim=32),
     dict(n_ctx=256, n_batch=512, type_k="q8_0", type_v="f16")),
    (Cfg(arch="qwen2", wtype="TQ2_0", emb_type="Q8_0", n_embd=256, n_ff=512, head_dim=32,
         n_head=8, n_head_kv=2), dict(n_ctx=300, n_batch=64, n_parallel=4, type_k="q8_0",
                                      type_v="q8_0")),
    (Cfg(arch="qwen3", wtype="TQ1_0", emb_type="F16", n_embd=256, n_ff=768, head_dim=64,
         n_head=4, n_head_kv=4, tied=True), dict(n_ctx=1000, n_batch=128, n_parallel=2)),
    (Cfg(arch="llama", wtype="F16", emb_type="F16", rope_freqs=True, n_head_kv=1,
         head_dim=32),
     dict(n_ctx=33, n_batch=7, n_threads=3, type_v="q8_0")),
]


@pytest.fixture(scope="module", params=range(len(CASES)), ids=lambda i: f"case{i}")
def engine_case(request, tmp_path_factory):
    cfg, ctx = CASES[request.param]
    path = tmp_path_factory.mktemp("plan") / "m.gguf"
    write_model(path, Cfg(**{k: v for k, v in vars(cfg).items() if k != "weights"}), seed=1)
    return path, dict(ctx)


def _within(planned: int, actual: int, tol: float = 0.05) -> bool:
    return abs(planned - actual) <= tol * max(actual, 1)


def test_cpu_plan_matches_engine_allocations(engine_case):
    path, ctx = engine_case
    p = PlanParams(**{"n_threads": 2, **ctx})
    threads = p.n_threads
    cpu = device_budgets(describe_gguf(path), p)["CPU"]
    with _core.Model(str(path)) as m:
        mm = m.memory_report()
        with _core.Context(m, n_ctx=p.n_ctx, n_batch=p.n_batch, n_seq_max=p.n_parallel,
                           n_threads=threads, type_k=p.type_k, type_v=p.type_v) as c:
            cm = c.memory_report()
    assert _within(cpu["weights_bytes"], mm["weights_bytes"])
    assert set(cpu["weights_by_type"]) == set(mm["weights_by_type"])
    for t, b in mm["weights_by_type"].items():
        assert _within(cpu["weights_by_type"][t], b), t
    assert _within(cpu["kv_bytes"], cm["kv_bytes"])
    assert _within(cpu["compute_bytes"], cm["compute_bytes"])
    assert _within(cpu["logits_bytes"], cm["logits_bytes"])


def test_plan_from_config_matches_converted_file(hf_model, tmp_path):
    """A config.json planned with --outtype X equals the file `bonsai convert --outtype X` writes
    (F16 fallback of rows that do not fit the ternary block included)."""
    facts = hf_model(arch="qwen2", hidden=128, ffn=256, n_head=4, n_head_kv=2)
    for outtype in ("q8_0", "ptq1_0"):
        out = tmp_path / f"{outtype}.gguf"
        args = ["convert", str(facts["dir"]), "--outfile", str(out), "--outtype", outtype,
                "--no-progress"] + (["--allow-lossy"] if outtype == "ptq1_0" else [])
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        planned = describe(str(facts["dir"]), outtype=outtype)
        p = PlanParams(n_ctx=128, n_threads=1)
        cpu = device_budgets(planned, p)["CPU"]
        with _core.Model(str(out)) as m:
            mm = m.memory_report()
        assert cpu["weights_by_type"] == mm["weights_by_type"], outtype
        assert cpu["weights_bytes"] == mm["weights_bytes"]


def test_largest_context_is_the_boundary(engine_case):
    path, ctx = engine_case
    d = describe_gguf(path)
    p = PlanParams(n_threads=2, n_batch=ctx.get("n_batch", 512),
                   n_parallel=ctx.get("n_parallel", 1), memory=parse_size("8MiB"))
    n = largest_context(d, p)
    assert n > 0
    assert device_budgets(d, p, n)["CPU"]["total_bytes"] <= p.memory
    assert device_budgets(d, p, n + 1)["CPU"]["total_bytes"] > p.memory


def test_preset_27b_shape_and_reference_sizes():
    d = describe_preset("27b", outtype="ptq1_0")
    assert (d.n_layer, d.n_embd, d.n_vocab, d.n_head, d.n_head_kv, d.n_ff) == \
        (60, 5120, 32000, 40, 8, 24576)
    assert 26.5e9 < d.n_params < 27.5e9
    # SPEC section 1: ~6.4 GB with the linear layers ternary and F16 embedding / head.
    assert 6.2e9 < sum(t.nbytes for t in d.tensors) < 6.6e9
    p = PlanParams(n_ctx=16384, n_gpu_layers=99, memory=parse_size("24GB"),
                   bandwidth=parse_bandwidth("1008GB/s"))
    plan = make_plan(d, p)
    gpu = plan["devices"]["GPU"]
    assert gpu["kv_bytes"] == 16384 * 60 * 2 * 1024 * 2      # f16 K and V, 8 KV heads of 128
    assert plan["budget"]["fits"] and plan["budget"]["max_ctx"] > 16384
    ceil = plan["decode_ceiling"]["at_ctx"]
    assert ceil["tokens_per_s"] == pytest.approx(1008e9 / ceil["bytes_per_step"])
    assert plan["decode_ceiling"]["at_empty"]["tokens_per_s"] > ceil["tokens_per_s"]


def test_target_bpw_reaches_the_average():
    d = describe_preset("27b", target_bpw=2.5)
    assert 2.45 < d.linear_bpw() <= 2.5          # the budget is a ceiling
    with pytest.raises(BonsaiError, match="below"):
        describe_preset("27b", target_bpw=1.0)


def test_partial_offload_splits_layers():
    d = describe_preset("27b")
    p = PlanParams(n_ctx=4096, n_gpu_layers=20, bandwidth=1e12)
    devs = device_budgets(d, p)
    assert devs["GPU"]["n_layers"] == 20 and devs["CPU"]["n_layers"] == 40
    assert devs["GPU"]["kv_bytes"] * 2 == devs["CPU"]["kv_bytes"]
    plan = make_plan(d, p)
    assert "decode_ceiling" not in plan and any("--cpu-bandwidth" in n for n in plan["notes"])
    p.cpu_bandwidth = 1e11
    assert make_plan(d, p)["decode_ceiling"]["at_ctx"]["tokens_per_s"] > 0
    assert "GPU (estimate)" in format_plan(make_plan(d, p))


def test_cli_text_and_json(engine_case):
    path, _ = engine_case
    r = run_cli("plan", str(path), "-c", "128", "--memory", "1GiB", "--bandwidth", "50GB/s")
    assert r.returncode == 0, r.stderr
    assert "KV cache" in r.stdout and "largest context that fits" in r.stdout
    r = run_cli("plan", str(path), "-c", "128", "-t", "2", "--json")
    plan = json.loads(r.stdout)
    assert plan["devices"]["CPU"]["kv_bytes"] > 0 and plan["settings"]["n_threads"] == 2


@pytest.mark.parametrize("args, msg", [
    ([], "give a model"),
    (["/nonexistent/model.gguf"], "not found"),
    (["--preset", "70b"], "unknown"),
    (["--preset", "27b", "--memory", "lots"], "--memory"),
    (["--preset", "27b", "--bandwidth", "-5GB/s"], "--bandwidth"),
    (["--preset", "27b", "-c", "0"], "--ctx-size"),
    (["--preset", "27b", "-np", "65"], "--parallel"),
    (["--preset", "27b", "--outtype", "q3_k"], "--outtype"),
])
def test_cli_errors(args, msg):
    r = run_cli("plan", *args)
    assert r.returncode != 0
    assert msg in r.stderr and "Traceback" not in r.stderr


def test_bad_files(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    r = run_cli("plan", str(bad))
    assert r.returncode == 1 and "malformed JSON" in r.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 10)
    r = run_cli("plan", str(junk))
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_help_worked_example_matches_the_planner():
    """The 27B table in `bonsai plan --help` is what the planner computes today."""
    from bonsai_runner.commands import plan as plan_cmd
    from bonsai_runner.plan import format_bytes

    rows = [ln.split() for ln in plan_cmd.__doc__.splitlines()
            if ln.strip().startswith(("f16 ", "q8_0 "))]
    assert len(rows) == 4
    d = describe_preset("27b")
    for kv, ctx, kv_size, kv_unit, tot, tot_unit, max_ctx, ceil, _ in rows:
        p = PlanParams(n_ctx=int(ctx), n_gpu_layers=99, type_k=kv, type_v=kv,
                       memory=parse_size("24GB"), bandwidth=parse_bandwidth("1008GB/s"))
        plan = make_plan(d, p)
        gpu = plan["devices"]["GPU"]
        assert gpu["kv_bytes"] / (1 << 30) == pytest.approx(float(kv_size), abs=0.01)
        assert format_bytes(gpu["total_bytes"]) == f"{tot} {tot_unit}"
        assert plan["budget"]["max_ctx"] == int(max_ctx)
        assert f"{plan['decode_ceiling']['at_ctx']['tokens_per_s']:.1f}" == ceil


@pytest.mark.parametrize("target", [None, 3.0])
def test_plan_from_config_matches_the_quantizer(hf_model, tmp_path, target):
    """The default policy gives exactly the quantizer's types (no sensitivity analysis); with
    --target-bpw the quantizer chooses tensors by measured error and the planner by a proxy, so
    only the total is compared (within 5%) and both reach the target."""
    facts = hf_model(arch="qwen3", hidden=128, ffn=256, n_head=4, n_head_kv=2, head_dim=64)
    out = tmp_path / "q.gguf"
    extra = ["--target-bpw", str(target)] if target else []
    r = run_cli("quantize", "--model-dir", str(facts["dir"]), "--output-dir", str(tmp_path / "q"),
                "--outfile", str(out), "--max-samples", "2", "--seq-len", "16", "--calib-steps",
                "0", "--no-progress", *extra)
    assert r.returncode == 0, r.stderr
    d = describe(str(facts["dir"]), target_bpw=target)
    cpu = device_budgets(d, PlanParams(n_ctx=64, n_threads=1))["CPU"]
    with _core.Model(str(out)) as m:
        mm = m.memory_report()
    if target is None:
        assert cpu["weights_by_type"] == mm["weights_by_type"]
        assert d.scheme == "PTQ1_0 default policy"
    else:
        assert _within(cpu["weights_bytes"], mm["weights_bytes"])
        assert d.linear_bpw() <= target + 1e-9
