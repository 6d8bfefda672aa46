"""Tests of the quality tools: `bonsai perplexity` (+ --save-logits / --kl-divergence),
`bonsai compare` and `bonsai eval-prompts`, on a tiny qwen2 model (BPE vocabulary) converted to F16
and quantized to PTQ1_0 with sensitivity analysis. The perplexity is checked against the engine's
own logits recomputed by hand and against the float64 numpy reference forward pass."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest

from bonsai_runner.errors import BonsaiError
from bonsai_runner.eval.prompts import load_suite
from bonsai_runner.gguf_reader import open_gguf
from conftest import run_cli
from model_factory import TRAINING_TEXT, make_hf_model


def _has_engine() -> bool:
    try:
        from bonsai_runner import _core
    except ImportError:
        return False
    return hasattr(_core, "Context")


pytestmark = pytest.mark.skipif(not _has_engine(), reason="needs the native engine")

CTX = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from bonsai_runner.convert import convert
    from bonsai_runner.quantize import QuantizeOptions, quantize_model

    base = tmp_path_factory.mktemp("eval")
    m = make_hf_model(base / "hf", arch="qwen2", tokenizer="bpe", hidden=128, ffn=256, n_layer=2,
                      n_head=4, n_head_kv=2, seed=5)
    f16 = base / "tiny-f16.gguf"
    convert(str(m["dir"]), str(f16), "f16", progress=False, log=lambda s: None)
    calib = base / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"{t} ({i})"}) + "\n"
                             for i in range(8) for t in TRAINING_TEXT), encoding="utf-8")
    q = base / "tiny-ptq1.gguf"
    quantize_model(QuantizeOptions(model_dir=str(m["dir"]), output_dir=str(base / "ptq1"),
                                   calib_file=str(calib), outfile=str(q), sensitivity=True,
                                   seq_len=32, max_samples=8, batch_size=4, progress=False),
                   log=lambda s: None)
    text = base / "text.txt"
    text.write_text("\n".join(TRAINING_TEXT * 8), encoding="utf-8")
    return {"f16": str(f16), "q": str(q), "text": str(text), "base": base}


def _opts(model, text, **kw):
    from bonsai_runner.eval.perplexity import PerplexityOptions

    return PerplexityOptions(model=model, file=text, ctx_size=kw.pop("ctx_size", CTX), **kw)


def _quiet(s):
    pass


def _scored_nll(logits: np.ndarray, chunk: np.ndarray, first: int) -> np.ndarray:
    x = logits[first:CTX - 1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    return lse - x[np.arange(x.shape[0]), chunk[first + 1:]]


def test_perplexity_matches_engine_logits_and_numpy_reference(tiny):
    from bonsai_runner import _core
    from bonsai_runner.eval.perplexity import run_perplexity
    from bonsai_runner.reference import ReferenceModel

    res = run_perplexity(_opts(tiny["f16"], tiny["text"], chunks=3, batch_size=16,
                               act_mode="float"), _quiet, _quiet)
    assert res.n_chunks == 3 and res.nll.size == 3 * (CTX - 1 - CTX // 2)
    model = _core.Model(tiny["f16"])
    ctx = _core.Context(model, n_ctx=CTX, n_batch=CTX, act_mode="float")
    toks = np.asarray(model.tokenize(open(tiny["text"], encoding="utf-8").read().encode(),
                                     add_special=False), dtype=np.int32)
    ref = ReferenceModel.from_gguf(tiny["f16"])
    mine, oracle = [], []
    for c in range(3):
        chunk = toks[c * CTX:(c + 1) * CTX]
        ctx.clear()
        mine.append(_scored_nll(ctx.decode(chunk, logits="all"), chunk, CTX // 2))
        oracle.append(_scored_nll(ref.logits(chunk), chunk, CTX // 2))
    mine, oracle = np.concatenate(mine), np.concatenate(oracle)
    np.testing.assert_allclose(res.nll, mine, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(res.nll, oracle, rtol=2e-3, atol=2e-3)
    assert res.ppl == pytest.approx(math.exp(oracle.mean()), rel=1e-3)
    sigma = math.sqrt((np.mean(mine ** 2) - mine.mean() ** 2) / (mine.size - 1))
    assert res.ppl_err == pytest.approx(math.exp(mine.mean()) * sigma, rel=1e-3)
    assert len(res.chunk_ppl) == 3 and res.chunk_ppl[-1] == pytest.approx(res.ppl)


def test_cli_output_and_kl_against_itself(tiny, tmp_path):
    ref = tmp_path / "ref.bin"
    p = run_cli("perplexity", "--model", tiny["f16"], "--file", tiny["text"], "--ctx-size", CTX,
                "--chunks", 4, "--save-logits", ref, check=True)
    assert re.search(r"^\[1\][\d.]+,\[2\][\d.]+,\[3\][\d.]+,\[4\][\d.]+,$", p.stdout, re.M)
    ppl = float(re.search(r"Final estimate: PPL = ([\d.]+) \+/- [\d.]+", p.stdout).group(1))
    assert ref.is_file() and not list(tmp_path.glob("*.tmp"))
    p = run_cli("perplexity", "--model", tiny["f16"], "--file", tiny["text"], "--kl-divergence",
                ref, check=True)
    assert float(re.search(r"Final estimate: PPL = ([\d.]+)", p.stdout).group(1)) == ppl
    assert abs(float(re.search(r"Mean    KLD:\s+(-?[\d.]+)", p.stdout).group(1))) < 1e-6
    assert re.search(r"Same top p: 100\.000", p.stdout)
    base = float(re.search(r"Mean PPL\(base\)\s+:\s+([\d.]+)", p.stdout).group(1))
    assert base == pytest.approx(ppl, rel=1e-5)


def test_kl_of_quantized_model_is_positive(tiny, tmp_path):
    from bonsai_runner.eval.perplexity import run_perplexity

    ref = tmp_path / "ref.bin"
    r0 = run_perplexity(_opts(tiny["f16"], tiny["text"], chunks=2, save_logits=str(ref)),
                        _quiet, _quiet)
    r1 = run_perplexity(_opts(tiny["q"], tiny["text"], ctx_size=None, kl_divergence=str(ref)),
                        _quiet, _quiet)
    assert r1.n_chunks == 2 and r1.kl.kld.mean() > 1e-4
    np.testing.assert_allclose(r1.kl.nll_ref, r0.nll)
    assert np.all(r1.kl.kld >= 0) and 0 <= r1.kl.same_top.mean() <= 1
    # the same statistics by hand from both models' engine logits (float64)
    from bonsai_runner import _core

    toks = []
    lps = {}
    for name in ("f16", "q"):
        model = _core.Model(tiny[name])
        ctx = _core.Context(model, n_ctx=CTX, n_batch=CTX)
        toks = np.asarray(model.tokenize(open(tiny["text"], encoding="utf-8").read().encode(),
                                         add_special=False), dtype=np.int32)
        rows = []
        for c in range(2):
            ctx.clear()
            x = ctx.decode(toks[c * CTX:(c + 1) * CTX], logits="all")[CTX // 2:CTX - 1]
            x = x.astype(np.float64)
            rows.append(x - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
                        - x.max(1, keepdims=True))
        lps[name] = np.concatenate(rows)
    p_ref = np.exp(lps["f16"])
    kl = (p_ref * (lps["f16"] - lps["q"])).sum(axis=1)
    np.testing.assert_allclose(r1.kl.kld, kl, rtol=1e-3, atol=1e-5)
    same = lps["f16"].argmax(1) == lps["q"].argmax(1)
    assert r1.kl.same_top.mean() == pytest.approx(same.mean())


def _damage(src: str, dst) -> None:
    """Copies `src` with output_norm.weight multiplied by -10: every logit is negated and
    sharpened, so the top token becomes the least likely one."""
    shutil.copyfile(src, dst)
    with open_gguf(src) as r:
        t = r.tensor("output_norm.weight")
        at = r.data_offset + t.offset
        w = r.tensor_array("output_norm.weight").copy()
    with open(dst, "r+b") as f:
        f.seek(at)
        f.write((w * -10).astype(np.float32).tobytes())


def test_compare_passes_for_itself_and_fails_for_damaged(tiny, tmp_path):
    p = run_cli("compare", "--reference", tiny["f16"], "--candidate", tiny["f16"], "--file",
                tiny["text"], "--ctx-size", CTX, "--chunks", 3)
    assert p.returncode == 0, p.stderr
    assert "verdict: PASS" in p.stdout and "PPL ratio     : 1.0000" in p.stdout
    bad = tmp_path / "damaged.gguf"
    _damage(tiny["q"], bad)
    p = run_cli("compare", "--reference", tiny["f16"], "--candidate", bad, "--file", tiny["text"],
                "--ctx-size", CTX, "--chunks", 3)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "verdict: FAIL" in p.stdout and "PPL ratio" in p.stdout
    listed = re.findall(r"^  (blk\.\d+\.\w+\.weight)\s+PTQ1_0\s+cosine ([\d.]+)", p.stdout, re.M)
    assert listed, p.stdout
    cos = [float(c) for _, c in listed]
    assert cos == sorted(cos)
    with open_gguf(tiny["q"]) as r:
        sens = json.loads(r.metadata["bonsai.quant.sensitivity"])
    assert all(name in sens for name, _ in listed)


def test_promotion_list_needs_sensitivity(tiny):
    from bonsai_runner.eval.compare import promotion_candidates

    rows, note = promotion_candidates(tiny["f16"])
    assert rows == [] and "--sensitivity-analysis" in note
    rows, _ = promotion_candidates(tiny["q"])
    assert rows and all(r["type"] == "PTQ1_0" for r in rows)


def test_eval_prompts_report(tiny, tmp_path):
    out = tmp_path / "report.md"
    run_cli("eval-prompts", "--models", tiny["f16"], tiny["q"], "--out", out, "--html",
            check=True)
    md = out.read_text(encoding="utf-8")
    suite = load_suite()
    assert len(suite) >= 10
    for p in suite:
        assert f"{p['id']} ({p['category']})" in md
    assert md.count("**tiny-f16.gguf**") == len(suite) == md.count("**tiny-ptq1.gguf**")
    page = out.with_suffix(".html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == len(suite)
    # greedy: the same model twice gives the same answers
    out2 = tmp_path / "again.md"
    run_cli("eval-prompts", "--models", tiny["f16"], "--out", out2, check=True)
    def answers(text):
        return re.findall(r"^\*\*tiny-f16\.gguf\*\*.*?\n\n(```.*?```)\n", text, re.M | re.S)

    assert answers(md) and answers(md) == answers(out2.read_text(encoding="utf-8"))


# ----- bad input -----

def test_missing_text_file(tiny, tmp_path):
    p = run_cli("perplexity", "--model", tiny["f16"], "--file", tmp_path / "nope.txt")
    assert p.returncode == 1 and "text file not found" in p.stderr
    assert p.stderr.count("\n") == 1


def test_missing_model(tiny, tmp_path):
    p = run_cli("compare", "--reference", tmp_path / "nope.gguf", "--candidate", tiny["q"])
    assert p.returncode == 1 and "--reference model file not found" in p.stderr


def test_text_shorter_than_one_chunk(tiny, tmp_path):
    from bonsai_runner.eval.perplexity import run_perplexity

    short = tmp_path / "short.txt"
    short.write_text("The quick brown fox.", encoding="utf-8")
    with pytest.raises(BonsaiError, match="fewer than one chunk of --ctx-size 64"):
        run_perplexity(_opts(tiny["f16"], str(short)), _quiet, _quiet)


def test_reference_from_another_vocabulary(tiny, tmp_path):
    from bonsai_runner.convert import convert
    from bonsai_runner.eval.perplexity import run_perplexity

    other = make_hf_model(tmp_path / "spm", arch="llama", tokenizer="spm", seed=1)
    other_gguf = tmp_path / "other.gguf"
    convert(str(other["dir"]), str(other_gguf), "f16", progress=False, log=_quiet)
    ref = tmp_path / "ref.bin"
    run_perplexity(_opts(str(other_gguf), tiny["text"], chunks=1, save_logits=str(ref)),
                   _quiet, _quiet)
    with pytest.raises(BonsaiError, match="vocabulary of .* tokens|tokenizes differently"):
        run_perplexity(_opts(tiny["f16"], tiny["text"], ctx_size=None, kl_divergence=str(ref)),
                       _quiet, _quiet)


def test_corrupt_and_truncated_reference(tiny, tmp_path):
    from bonsai_runner.eval.perplexity import run_perplexity

    ref = tmp_path / "ref.bin"
    run_perplexity(_opts(tiny["f16"], tiny["text"], chunks=1, save_logits=str(ref)),
                   _quiet, _quiet)
    data = ref.read_bytes()
    ref.write_bytes(data[:-100])
    with pytest.raises(BonsaiError, match="truncated or corrupt"):
        run_perplexity(_opts(tiny["f16"], tiny["text"], ctx_size=None, kl_divergence=str(ref)),
                       _quiet, _quiet)
    ref.write_bytes(b"not a reference file at all")
    with pytest.raises(BonsaiError, match="bad magic"):
        run_perplexity(_opts(tiny["f16"], tiny["text"], ctx_size=None, kl_divergence=str(ref)),
                       _quiet, _quiet)
    with pytest.raises(BonsaiError, match="differs from the reference"):
        ref.write_bytes(data)
        run_perplexity(_opts(tiny["f16"], tiny["text"], ctx_size=32, kl_divergence=str(ref)),
                       _quiet, _quiet)
