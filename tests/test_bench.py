"""`bonsai bench`: runs on tiny models with one repetition and small tests, prints well-formed
md / csv / json (every configuration of the matrix, positive speeds, the roofline columns with
--bandwidth), and answers bad input with one clear error."""

from __future__ import annotations

import csv
import io
import json

import pytest
from conftest import run_cli
from engine_fixtures import Cfg, write_model

from bonsai_runner import _core
from bonsai_runner.bench import BenchConfig, run_bench


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    a = write_model(d / "a.gguf", Cfg(arch="llama", wtype="TQ2_0", emb_type="F16", n_embd=256,
                                      n_ff=512, head_dim=32, n_head=8), seed=0)
    b = write_model(d / "b.gguf", Cfg(arch="qwen2", wtype="Q8_0", emb_type="Q8_0", head_dim=32),
                    seed=1)
    assert a and b
    return str(d / "a.gguf"), str(d / "b.gguf")


SMALL = ["-r", "1", "-p", "16", "-n", "4", "--probe-size", "8MiB"]


def test_markdown_table(models):
    a, b = models
    r = run_cli("bench", "-m", a, "-m", b, "-t", "1,2", *SMALL)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert rows[0] == "| model | size | params | backend | threads | test | t/s |"
    assert rows[1].startswith("| --- | ---: |")
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in rows[2:]]
    assert len(body) == 2 * 2 * 2          # models x threads x (pp, tg)
    assert [c[0] for c in body] == ["llama 1M TQ2_0"] * 4 + ["qwen2 138K Q8_0"] * 4
    assert [c[4] for c in body[:4]] == ["1", "1", "2", "2"]
    assert [c[5] for c in body[:4]] == ["pp16", "tg4", "pp16", "tg4"]
    for c in body:
        mean, sd = c[6].split(" ± ")
        assert float(mean) > 0 and float(sd) == 0.0      # one repetition: no spread


def test_csv_matrix_and_roofline(models):
    a, _ = models
    r = run_cli("bench", "-m", a, "-ctk", "f16,q8_0", "-b", "8,512", "--act-mode", "float",
                "-t", "1", "--bandwidth", "-o", "csv", *SMALL)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 2 * 2 * 2
    assert {(x["type_k"], x["n_batch"]) for x in rows} == \
        {("f16", "8"), ("f16", "512"), ("q8_0", "8"), ("q8_0", "512")}
    assert {x["act_mode"] for x in rows} == {"float"}
    for x in rows:
        assert float(x["avg_ts"]) > 0
        if x["test"].startswith("tg"):
            roof = float(x["bandwidth"]) / float(x["bytes_per_token"])
            assert float(x["roofline_ts"]) == pytest.approx(roof)
            assert float(x["roofline_pct"]) == pytest.approx(100 * float(x["avg_ts"]) / roof)
        else:
            assert x["roofline_ts"] == ""


def test_json_and_bytes_per_token(models):
    a, _ = models
    r = run_cli("bench", "-m", a, "-t", "1", "-o", "json", "-n", "8", "-p", "0", "-r", "2",
                "--bandwidth", "--probe-size", "8MiB")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (res,) = doc["results"]
    assert res["test"] == "tg8" and len(res["samples_ts"]) == 2
    assert doc["bandwidth_probes"][0]["n_threads"] == 1
    with _core.Model(a) as m:
        weights = m.memory_report()["weights_bytes"]
        hp = m.hparams
    # every matrix but token_embd read once, one embedding row, KV rows of 3.5 cells on average
    kv_cell = hp["n_layer"] * 2 * hp["n_head_kv"] * hp["head_dim"] * 2
    assert res["bytes_per_token"] < weights + kv_cell * 4
    assert res["bytes_per_token"] > weights - hp["n_vocab"] * hp["n_embd"] * 2


def test_markdown_roofline_columns(models):
    a, _ = models
    r = run_cli("bench", "-m", a, "-t", "1", "--bandwidth", *SMALL)
    assert r.returncode == 0, r.stderr
    assert "memory read bandwidth (1 thread):" in r.stdout
    tg = [ln for ln in r.stdout.splitlines() if "| tg4 |" in ln][0]
    assert tg.rstrip(" |").endswith("%")


def test_api_results(models):
    a, _ = models
    res, probes = run_bench(BenchConfig(models=[a], n_prompt=[8], n_gen=[0], repetitions=1,
                                        threads=[1]))
    assert probes == {} and len(res) == 1 and res[0].test == "pp8" and res[0].avg_ts > 0


@pytest.mark.parametrize("args, msg", [
    ([], "no model given"),
    (["-m", "/nonexistent.gguf"], "file not found"),
    (["-m", "MODEL", "-r", "0"], "repetitions"),
    (["-m", "MODEL", "-p", "12x"], "-p"),
    (["-m", "MODEL", "-p", "0", "-n", "0"], "nothing to run"),
    (["-m", "MODEL", "-t", "0"], "thread counts"),
    (["-m", "MODEL", "-ctk", "q4_0"], "-ctk"),
    (["-m", "MODEL", "--act-mode", "fp8"], "--act-mode"),
    (["-m", "MODEL", "--probe-size", "big", "--bandwidth"], "--probe-size"),
])
def test_bad_input(models, args, msg):
    r = run_cli("bench", *[models[0] if x == "MODEL" else x for x in args])
    assert r.returncode != 0
    assert msg in r.stderr and "Traceback" not in r.stderr


def test_bad_model_file(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    r = run_cli("bench", "-m", str(junk), "-r", "1", "-p", "4", "-n", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.startswith("error:")


def test_q8_kv_on_small_heads_is_refused(tmp_path):
    path = tmp_path / "h16.gguf"
    write_model(path, Cfg(head_dim=16), seed=2)
    r = run_cli("bench", "-m", str(path), "-ctk", "q8_0", "-r", "1", "-p", "4", "-n", "0")
    assert r.returncode == 1 and "multiple of 32" in r.stderr


def test_bandwidth_probe():
    r = _core.measure_read_bandwidth(8 << 20, 1, 2)
    assert r["buffer_bytes"] == 8 << 20 and r["n_threads"] == 1 and r["repeats"] == 2
    assert 1e8 < r["mean_bytes_per_s"] <= r["bytes_per_s"] < 1e13
    for args, msg in (((1 << 10, 1, 1), "at least 1 MiB"), ((8 << 20, 1, 0), "repeats"),
                      ((8 << 20, -1, 1), "n_threads")):
        with pytest.raises(_core.BonsaiError, match=msg):
            _core.measure_read_bandwidth(*args)
