"""The built-in calibration set (quantize/calibration.py): size, mix, determinism, missing parts.

The default run of the issue is 128 sequences x 512 tokens; the built-in set must supply them
from the shipped samples, the pydoc reference topics and standard-library sources read at run
time. Token counts come from the tiny SentencePiece tokenizer of tests/model_factory.py and, for
the size, from a character estimate that is on the safe side for a large-vocabulary tokenizer
(Qwen2.5 gets ~4.4 characters per token on both parts).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_factory import write_tokenizer

from bonsai_runner.eval.perplexity import default_eval_file
from bonsai_runner.quantize import calibration
from bonsai_runner.quantize.calibration import (BUILTIN_SOURCE, Tokenizer, default_samples,
                                                load_calibration, split_chunks)

CHARS_PER_TOKEN = 4.5


@pytest.fixture(scope="module")
def spm_tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    info = write_tokenizer(d, "spm")
    return Tokenizer(d), info["n_tokens"]


def test_builtin_set_supplies_128_sequences_of_512(spm_tok):
    samples, parts, warnings = default_samples(0)
    chars = sum(len(t) for t, _, _ in samples)
    assert chars / CHARS_PER_TOKEN >= 1.25 * 128 * 512
    assert warnings == []
    tok, n_vocab = spm_tok
    cal = load_calibration(None, tok, 512, 128, 0, n_vocab)
    assert cal.tokens.shape == (128, 512)
    assert cal.source == BUILTIN_SOURCE
    assert cal.warnings == []


def test_builtin_set_mix_is_reported(spm_tok):
    tok, n_vocab = spm_tok
    s = load_calibration(None, tok, 512, 128, 0, n_vocab).summary()
    assert set(s["parts"]) == {"shipped", "pydoc", "stdlib"}
    assert s["parts"]["shipped"]["samples"] == len(calibration.read_samples(
        calibration.default_calibration_file()))
    assert abs(sum(p["share"] for p in s["parts"].values()) - 1.0) < 1e-3
    assert sum(p["tokens"] for p in s["parts"].values()) == s["tokens_available"]
    assert {"code", "prose", "math", "cjk", "chat", "multilingual"} <= set(s["domains"])
    chars = {k: p["chars"] for k, p in s["parts"].items()}
    assert chars["stdlib"] <= 0.45 * sum(chars.values())       # code does not swamp the mix
    assert chars["pydoc"] > chars["stdlib"]
    json.dumps(s)                                              # goes into quant_config.json


def test_builtin_set_always_keeps_the_shipped_sequences(spm_tok):
    tok, n_vocab = spm_tok
    shipped = [tok.encode(t) for t, _ in calibration.read_samples(
        calibration.default_calibration_file())]
    lead = np.asarray([i for ids in shipped for i in ids][: 4 * 64]).reshape(4, 64)
    few = load_calibration(None, tok, 64, 4, 11, n_vocab)      # fewer than the shipped ones fill
    np.testing.assert_array_equal(few.tokens, lead)
    many = load_calibration(None, tok, 64, 300, 11, n_vocab)
    np.testing.assert_array_equal(many.tokens[:4], lead)
    assert len({r.tobytes() for r in many.tokens}) == many.tokens.shape[0]


def test_builtin_set_is_deterministic_for_a_seed(spm_tok):
    tok, n_vocab = spm_tok
    a = load_calibration(None, tok, 256, 64, 7, n_vocab)
    b = load_calibration(None, tok, 256, 64, 7, n_vocab)
    c = load_calibration(None, tok, 256, 64, 8, n_vocab)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.summary() == b.summary()
    assert not np.array_equal(a.tokens, c.tokens)
    assert [t for t, _, _ in default_samples(3)[0]] == [t for t, _, _ in default_samples(3)[0]]


@pytest.mark.parametrize("part", ["pydoc", "stdlib"])
def test_a_missing_part_is_reported_and_skipped(spm_tok, monkeypatch, part):
    if part == "pydoc":
        monkeypatch.setattr(calibration, "_pydoc_topics", lambda: None)
    else:
        monkeypatch.setattr(calibration, "_stdlib_dir", lambda: None)
    samples, parts, warnings = default_samples(0)
    assert part not in parts and {"shipped"} <= set(parts)
    assert len(warnings) == 1
    assert ("pydoc_data" if part == "pydoc" else "standard-library") in warnings[0]
    tok, n_vocab = spm_tok
    cal = load_calibration(None, tok, 512, 128, 0, n_vocab)
    assert warnings[0] in cal.warnings
    assert part not in cal.summary()["parts"]


def test_builtin_set_does_not_overlap_the_evaluation_text(monkeypatch):
    # every chunk of every part, not only the ones a seed picks
    monkeypatch.setattr(calibration, "PROSE_CHARS", 10 ** 9)
    monkeypatch.setattr(calibration, "CODE_CHARS", 10 ** 9)
    text = "\n".join(t for t, _, _ in default_samples(0)[0])
    with open(default_eval_file(), encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if len(ln.strip()) >= 40]
    assert len(lines) > 50
    assert [ln for ln in lines if ln in text] == []


def test_split_chunks_keeps_the_text_in_order():
    paras = [f"paragraph {i} " + "word " * (i * 37 % 300) for i in range(60)]
    text = "\n\n".join(paras)
    chunks = split_chunks(text, 1000)
    assert "\n\n".join(chunks) == text
    assert all(len(c) <= 1000 + 1600 for c in chunks)
    assert sum(len(c) > 1000 for c in chunks) <= sum(len(p) > 1000 for p in paras)
    long = "\n".join(f"line {i}" for i in range(500))
    assert "\n".join(split_chunks(long, 1000)) == long
    assert all(len(c) <= 1000 for c in split_chunks(long, 1000))


def test_user_file_warnings_still_work(spm_tok, tmp_path):
    tok, n_vocab = spm_tok
    p = tmp_path / "code.jsonl"
    with open(p, "w", encoding="utf-8") as f:
        for i in range(200):
            f.write(json.dumps({"text": f"def f{i}(x):\n    return x + {i};\n", "domain": "code"})
                    + "\n")
    cal = load_calibration(p, tok, 64, 4, 0, n_vocab)
    assert cal.summary().get("parts") is None and "parts" not in cal.summary()
    assert any("narrow" in w for w in cal.warnings)
    assert any("small" in w for w in cal.warnings)
