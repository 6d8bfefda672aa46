"""Bad input to `bonsai convert`: one clear error naming the problem, exit status 1, no output.

Each case damages a copy of a fixture model and runs the command-line entry point in-process;
every test also checks that neither the output file nor a temporary file was left behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bonsai_runner.cli import convert_main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_copy(hf_model, tmp_path):
    m = hf_model(arch="qwen2", tokenizer="bpe")
    d = tmp_path / "model"
    shutil.copytree(m["dir"], d)
    return d


def run(src, out, *extra, capsys=None):
    rc = convert_main([str(src), "--outfile", str(out), "--no-progress", *extra])
    err = capsys.readouterr().err if capsys is not None else ""
    return rc, err


def assert_clean(out: Path):
    assert not out.exists()
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith((out.name, "."))
                 and p.name != out.name and "tmp" in p.name]
    assert leftovers == []


def rewrite_weights(d: Path, edit):
    from safetensors.numpy import load_file, save_file

    st = load_file(str(d / "model.safetensors"))
    edit(st)
    save_file(st, str(d / "model.safetensors"))


def test_missing_config(model_copy, tmp_path, capsys):
    (model_copy / "config.json").unlink()
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "no config.json" in err and str(model_copy) in err
    assert_clean(out)


def test_unknown_architecture(model_copy, tmp_path, capsys):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "unsupported architecture 'GPTNeoXForCausalLM'" in err
    assert "LlamaForCausalLM" in err and "Qwen2ForCausalLM" in err and "Qwen3ForCausalLM" in err
    assert_clean(out)


def test_missing_tensor(model_copy, tmp_path, capsys):
    rewrite_weights(model_copy, lambda st: st.pop("model.layers.1.mlp.up_proj.weight"))
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "missing 1 tensor(s): model.layers.1.mlp.up_proj.weight" in err
    assert_clean(out)


def test_extra_tensor(model_copy, tmp_path, capsys):
    rewrite_weights(model_copy, lambda st: st.update(
        {"model.layers.0.mlp.extra_proj.weight": np.zeros((4, 4), np.float16)}))
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "unexpected 1 tensor(s): model.layers.0.mlp.extra_proj.weight" in err
    assert_clean(out)


def test_misshaped_tensor(model_copy, tmp_path, capsys):
    def edit(st):
        st["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float16)
    rewrite_weights(model_copy, edit)
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1
    assert "model.layers.0.self_attn.k_proj.weight: [16, 64] (expected [32, 64])" in err
    assert_clean(out)


def test_all_tensor_problems_reported_at_once(model_copy, tmp_path, capsys):
    def edit(st):
        st.pop("model.norm.weight")
        st.pop("model.layers.0.self_attn.v_proj.bias")
        st["model.layers.9.mlp.up_proj.weight"] = np.zeros((2, 2), np.float16)
        st["model.layers.1.mlp.down_proj.weight"] = np.zeros((64, 64), np.float16)
    rewrite_weights(model_copy, edit)
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1
    for name in ("model.norm.weight", "model.layers.0.self_attn.v_proj.bias",
                 "model.layers.9.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert name in err, name
    assert "missing 2" in err and "unexpected 1" in err and "1 mis-shaped" in err
    assert_clean(out)


def test_vocab_differs_from_embedding(hf_model, model_copy, tmp_path, capsys):
    other = hf_model(arch="llama", tokenizer="spm")
    (model_copy / "tokenizer.json").unlink()
    shutil.copy(other["dir"] / "tokenizer.model", model_copy / "tokenizer.model")
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1
    assert f"the tokenizer has {other['n_tokens']} tokens but the token embedding has" in err
    assert_clean(out)


def test_malformed_json(model_copy, tmp_path, capsys):
    (model_copy / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "hidden_size": ')
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "config.json: malformed JSON at line 1" in err
    (model_copy / "config.json").write_bytes(b'{"architectures": ["\xff\xfe"]}')
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "config.json: not valid UTF-8 text" in err
    assert_clean(out)


def test_malformed_tokenizer_json(model_copy, tmp_path, capsys):
    (model_copy / "tokenizer.json").write_text("{not json")
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "tokenizer.json: malformed JSON" in err
    assert_clean(out)


def test_truncated_safetensors(model_copy, tmp_path, capsys):
    f = model_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "model.safetensors" in err and "truncated" in err
    assert_clean(out)


def test_nan_weights(model_copy, tmp_path, capsys):
    def edit(st):
        w = st["model.layers.1.self_attn.o_proj.weight"].copy()
        w[3, 7] = np.nan
        st["model.layers.1.self_attn.o_proj.weight"] = w
    rewrite_weights(model_copy, edit)
    out = tmp_path / "m.gguf"
    rc, err = run(model_copy, out, "--outtype", "f16", capsys=capsys)
    assert rc == 1
    assert "model.layers.1.self_attn.o_proj.weight" in err and "NaN/Inf" in err
    assert_clean(out)


def test_existing_outfile_needs_force(model_copy, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    rc, err = run(model_copy, out, capsys=capsys)
    assert rc == 1 and "already exists" in err and "--force" in err
    assert out.read_bytes() == b"keep me"
    rc, _ = run(model_copy, out, "--force", capsys=capsys)
    assert rc == 0 and out.read_bytes()[:4] == b"GGUF"


def test_not_a_model(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    rc, err = run(f, tmp_path / "m.gguf", capsys=capsys)
    assert rc == 1 and "not a GGUF file" in err
    rc, err = run(tmp_path / "nope", tmp_path / "m.gguf", capsys=capsys)
    assert rc == 1 and "no such file or directory" in err
    assert_clean(tmp_path / "m.gguf")


def test_script_help_explains_types():
    p = subprocess.run([sys.executable, str(REPO / "converters" / "convert_hf_to_gguf.py"),
                        "--help"], capture_output=True, text=True,
                       env={"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0
    for word in ("--outfile", "--outtype", "--allow-lossy", "ptq1_0", "q2_0", "tq1_0", "examples"):
        assert word in p.stdout, word
