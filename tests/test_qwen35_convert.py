"""The Hugging Face qwen3_5 -> GGUF qwen35 converter (SPEC §6a), against transformers and upstream.

- tests/qwen35_hf_forward.py (float64 numpy, Hugging Face semantics) matches transformers' own
  forward on the tiny model of tests/qwen35_factory.py: the oracle the engine tests use;
- the converted file's tensors are the checkpoint's under llama.cpp's conventions, checked by
  undoing each one with code of its own (index arithmetic for the V-head order, 1 + w, -exp);
- the conditional-generation layout (model.language_model.*) converts to the same file, its vision
  and MTP tensors named in one note; --hadamard folds qwen35's GDN projections; GGUF re-typing keeps
  ssm_conv1d at F32;
- `slow`: upstream llama.cpp's convert_hf_to_gguf.py (the llama-cpp-python 0.3.36 sdist, fetched by
  scripts/fetch_llama_cpp_source.py into the cache; skipped when that fails) writes the same tensor
  names, shapes, types and values and the same qwen35.* / tokenizer.* metadata for every layout and
  out type; only general.* provenance keys differ (UPSTREAM_ONLY_KEYS).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from gguf_readback import read_gguf
from qwen35_factory import QWEN35_SPLIT_REGEX, make_qwen35_model, skipped_tensor_names
from qwen35_hf_forward import qwen35_forward

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_5")

ROOT = Path(__file__).resolve().parent.parent
IDS = [5, 17, 42, 99, 3, 250, 7, 8, 120, 64, 11, 200, 33, 1, 2, 90, 300, 301, 5, 5]


@pytest.fixture(scope="session")
def qwen35(tmp_path_factory):
    """qwen35(tied=False, layout="causal") -> the factory's facts; each variant built once."""
    cache: dict = {}

    def get(tied: bool = False, layout: str = "causal") -> dict:
        key = (tied, layout)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"qwen35_{layout}_{'tied' if tied else 'untied'}")
            cache[key] = make_qwen35_model(d / "model", tied=tied, layout=layout)
        return cache[key]

    return get


def convert_ours(m: dict, out: Path, outtype: str = "f32", *extra: str):
    r = run_cli("convert", m["dir"], "--outtype", outtype, "--outfile", out, "--no-progress",
                *extra)
    assert r.returncode == 0, r.stderr
    return r


# ----- the tiny model and the numpy oracle -----

@pytest.mark.parametrize("tied", [False, True])
def test_numpy_forward_matches_transformers(qwen35, tied):
    m = qwen35(tied=tied)
    want = qwen35_forward(m["tensors"], m["text_config"], IDS)
    model64 = copy.deepcopy(m["model"]).double()
    with torch.no_grad():
        got = model64(torch.tensor([IDS])).logits[0].numpy()
    std = want.std()
    assert 0.5 < std < 20, std                                  # informative, not degenerate
    assert len(set(want.argmax(-1).tolist())) >= len(IDS) // 2   # top-1 varies across positions
    assert (want.argmax(-1) != np.asarray(IDS)).mean() > 0.8     # and does not echo the input
    assert np.abs(got - want).max() <= 1e-4 * std


def test_factory_layers_follow_the_3_to_1_pattern(qwen35):
    m = qwen35()
    assert m["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    cfg = m["text_config"]
    assert cfg["linear_num_value_heads"] != cfg["linear_num_key_heads"]


# ----- our converter: the file holds the checkpoint under llama.cpp's conventions -----

def _grouped_index(n_k: int, n_v: int, head_dim: int) -> np.ndarray:
    """For every stored (tiled) channel, the Hugging Face (grouped) channel it holds."""
    rep = n_v // n_k
    idx = np.empty(n_v * head_dim, dtype=np.int64)
    for j in range(n_v):            # tiled head j reads K head j % n_k, copy j // n_k of it
        h = (j % n_k) * rep + j // n_k
        idx[j * head_dim:(j + 1) * head_dim] = np.arange(h * head_dim, (h + 1) * head_dim)
    return idx


@pytest.mark.parametrize("tied", [False, True])
def test_converted_tensors_are_the_checkpoint_under_llama_cpp_conventions(qwen35, tmp_path, tied):
    m = qwen35(tied=tied)
    cfg, hf = m["text_config"], m["tensors"]
    out = tmp_path / "m.gguf"
    convert_ours(m, out)
    rb = read_gguf(out)
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    qk = 2 * n_k * dk
    v_rows = _grouped_index(n_k, n_v, dv)
    heads = _grouped_index(n_k, n_v, 1)
    qkv_rows = np.concatenate([np.arange(qk), qk + v_rows])
    expect = {"token_embd.weight": hf["model.embed_tokens.weight"],
              "output_norm.weight": 1 + hf["model.norm.weight"]}
    if not tied:
        expect["output.weight"] = hf["lm_head.weight"]
    for i, kind in enumerate(m["layer_types"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        expect[g + "attn_norm.weight"] = 1 + hf[p + "input_layernorm.weight"]
        expect[g + "post_attention_norm.weight"] = 1 + hf[p + "post_attention_layernorm.weight"]
        for a, b in (("gate", "gate"), ("up", "up"), ("down", "down")):
            expect[g + f"ffn_{b}.weight"] = hf[p + f"mlp.{a}_proj.weight"]
        if kind == "linear_attention":
            la = p + "linear_attn."
            expect[g + "attn_qkv.weight"] = hf[la + "in_proj_qkv.weight"][qkv_rows]
            expect[g + "attn_gate.weight"] = hf[la + "in_proj_z.weight"][v_rows]
            expect[g + "ssm_alpha.weight"] = hf[la + "in_proj_a.weight"][heads]
            expect[g + "ssm_beta.weight"] = hf[la + "in_proj_b.weight"][heads]
            expect[g + "ssm_conv1d.weight"] = hf[la + "conv1d.weight"][:, 0, :][qkv_rows]
            expect[g + "ssm_dt.bias"] = hf[la + "dt_bias"][heads]
            expect[g + "ssm_a"] = -np.exp(hf[la + "A_log"].astype(np.float64)[heads])
            expect[g + "ssm_norm.weight"] = hf[la + "norm.weight"]          # plain, no 1 + w
            expect[g + "ssm_out.weight"] = hf[la + "out_proj.weight"][:, v_rows]
        else:
            sa = p + "self_attn."
            expect[g + "attn_q.weight"] = hf[sa + "q_proj.weight"]          # query | gate per head
            expect[g + "attn_k.weight"] = hf[sa + "k_proj.weight"]
            expect[g + "attn_v.weight"] = hf[sa + "v_proj.weight"]
            expect[g + "attn_output.weight"] = hf[sa + "o_proj.weight"]
            expect[g + "attn_q_norm.weight"] = 1 + hf[sa + "q_norm.weight"]
            expect[g + "attn_k_norm.weight"] = 1 + hf[sa + "k_norm.weight"]
    assert sorted(rb.types) == sorted(expect)
    for name, want in expect.items():
        got = rb.values(name)
        assert rb.types[name] == "F32" and got.shape == want.shape, name
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=2.5e-7, atol=0, err_msg=name)
    assert rb.shapes["blk.0.ssm_conv1d.weight"] == (qk + n_v * dv, K)   # ggml ne {K, conv_dim}


def test_metadata_of_the_tiny_model(qwen35, tmp_path):
    m = qwen35()
    out = tmp_path / "m.gguf"
    convert_ours(m, out)
    md = read_gguf(out).metadata
    want = {"general.architecture": "qwen35", "qwen35.block_count": 4,
            "qwen35.context_length": 4096, "qwen35.embedding_length": 64,
            "qwen35.feed_forward_length": 128, "qwen35.attention.head_count": 2,
            "qwen35.attention.head_count_kv": 1, "qwen35.attention.key_length": 32,
            "qwen35.attention.value_length": 32, "qwen35.rope.dimension_count": 8,
            "qwen35.rope.dimension_sections": [2, 1, 1, 0], "qwen35.rope.freq_base": 1e7,
            "qwen35.ssm.conv_kernel": 4, "qwen35.ssm.state_size": 16,
            "qwen35.ssm.group_count": 2, "qwen35.ssm.time_step_rank": 4,
            "qwen35.ssm.inner_size": 64, "qwen35.full_attention_interval": 4,
            "qwen35.attention.recurrent_layers": [True, True, True, False],
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35",
            "tokenizer.ggml.eos_token_id": m["tokens"]["eos"],
            "tokenizer.ggml.padding_token_id": m["tokens"]["pad"]}
    for k, v in want.items():
        assert md.get(k) == pytest.approx(v), k
    assert md["qwen35.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert "qwen35.vocab_size" not in md                   # upstream writes none for qwen35
    assert len(md["tokenizer.ggml.tokens"]) == m["n_vocab"]
    import json

    tok_cfg = json.loads(m["dir"].joinpath("tokenizer_config.json").read_text(encoding="utf-8"))
    assert md["tokenizer.chat_template"] == tok_cfg["chat_template"]


def test_qwen35_split_regex_is_detected_as_qwen35():
    from bonsai_runner.convert.tokenizer_meta import detect_pre_tokenizer

    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN35_SPLIT_REGEX}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    assert detect_pre_tokenizer(pre) == "qwen35"


@pytest.mark.parametrize("tied", [False, True])
def test_conditional_layout_converts_to_the_same_file_and_names_what_it_skipped(qwen35, tmp_path,
                                                                               tied):
    causal, cond = qwen35(tied=tied), qwen35(tied=tied, layout="conditional")
    a, b = tmp_path / "causal.gguf", tmp_path / "cond.gguf"
    convert_ours(causal, a, "f16")
    r = convert_ours(cond, b, "f16")
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: skipped")]
    assert len(notes) == 1, r.stderr
    assert "model.visual.*" in notes[0] and "mtp.*" in notes[0]
    n_visual = sum(n.startswith("model.visual.") for n in skipped_tensor_names())
    assert f"vision encoder (model.visual.*): {n_visual} tensor(s)" in notes[0]
    ra, rb = read_gguf(a), read_gguf(b)
    assert ra.types == rb.types and ra.shapes == rb.shapes
    for n in ra.raw:
        assert np.array_equal(ra.raw[n], rb.raw[n]), n
    skip = {"general.name"}
    assert {k: v for k, v in ra.metadata.items() if k not in skip} == \
        {k: v for k, v in rb.metadata.items() if k not in skip}


def test_causal_checkpoint_with_stray_mtp_tensors_is_not_an_error(qwen35, tmp_path):
    """A CausalLM export that kept mtp.* (as some re-uploads do) converts, with the note."""
    import shutil

    from safetensors.numpy import load_file, save_file

    m = qwen35()
    d = tmp_path / "m"
    shutil.copytree(m["dir"], d)
    t = load_file(str(d / "model.safetensors"))
    t["mtp.fc.weight"] = np.zeros((64, 128), np.float32)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    r = run_cli("convert", d, "--outtype", "f32", "--outfile", tmp_path / "o.gguf",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "multi-token-prediction head (mtp.*): 1 tensor(s)" in r.stderr


def test_bad_layer_types_and_missing_tensors_are_named(qwen35, tmp_path):
    import json
    import shutil

    m = qwen35()
    d = tmp_path / "m"
    shutil.copytree(m["dir"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = cfg["layer_types"][:3]
    (d / "config.json").write_text(json.dumps(cfg))
    r = run_cli("convert", d, "--outfile", tmp_path / "o.gguf", "--no-progress")
    assert r.returncode != 0 and "layer_types must list 4 entries" in r.stderr
    cfg["layer_types"] = ["full_attention"] * 4          # the GDN tensors do not fit
    (d / "config.json").write_text(json.dumps(cfg))
    r = run_cli("convert", d, "--outfile", tmp_path / "o.gguf", "--no-progress")
    assert r.returncode != 0
    assert "model.layers.0.self_attn.q_proj.weight" in r.stderr          # missing
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in r.stderr   # unexpected
    assert not (tmp_path / "o.gguf").exists()


def test_gguf_retyping_keeps_conv_taps_f32(qwen35, tmp_path):
    m = qwen35()
    src = tmp_path / "f32.gguf"
    convert_ours(m, src)
    out = tmp_path / "f16.gguf"
    r = run_cli("convert", src, "--outtype", "f16", "--outfile", out, "--no-progress",
                "--allow-lossy")
    assert r.returncode == 0, r.stderr
    rb = read_gguf(out)
    assert rb.types["blk.0.ssm_conv1d.weight"] == "F32"
    assert rb.types["blk.0.ssm_alpha.weight"] == "F16" and rb.types["blk.0.attn_qkv.weight"] == "F16"


def _wht(n: int) -> np.ndarray:
    r = np.arange(n)
    bits = np.vectorize(lambda v: bin(v).count("1"))(r[:, None] & r[None, :])
    return (-1.0) ** bits / np.sqrt(n)


def test_hadamard_folds_the_gdn_projections(qwen35, tmp_path):
    """--hadamard B folds attn_qkv, attn_gate and ssm_out (and the usual kinds); a folded weight
    applied to the rotated activation WHT_B(s * x) gives the original product."""
    m = qwen35()
    plain, rot = tmp_path / "plain.gguf", tmp_path / "rot.gguf"
    convert_ours(m, plain, "f32")
    convert_ours(m, rot, "f32", "--hadamard", "32")
    a, b = read_gguf(plain), read_gguf(rot)
    names = set(b.metadata["prism.hadamard.weight_names"])
    for i, kind in enumerate(m["layer_types"]):
        g = f"blk.{i}."
        kinds = (["attn_qkv", "attn_gate", "ssm_out"] if kind == "linear_attention"
                 else ["attn_q", "attn_k", "attn_v", "attn_output"]) + ["ffn_gate", "ffn_up",
                                                                      "ffn_down"]
        assert {g + k + ".weight" for k in kinds} <= names
        assert g + "ssm_alpha.weight" not in names and g + "ssm_beta.weight" not in names
    assert "prism.hadamard.gdn_v_grouped" not in b.metadata
    widths = list(b.metadata["prism.hadamard.sign_widths"])
    values = np.asarray(b.metadata["prism.hadamard.sign_values"], dtype=np.float64)
    signs, off = {}, 0
    for w in widths:
        signs[w], off = values[off:off + w], off + w
    H = _wht(32)
    x = np.random.default_rng(0).standard_normal(64)
    for name in ("blk.0.ssm_out.weight", "blk.0.attn_qkv.weight", "blk.0.attn_gate.weight"):
        w0, w1 = a.values(name).astype(np.float64), b.values(name).astype(np.float64)
        xr = ((signs[64] * x).reshape(-1, 32) @ H.T).reshape(-1)
        np.testing.assert_allclose(w1 @ xr, w0 @ x, rtol=1e-5, atol=1e-5, err_msg=name)


# ----- upstream llama.cpp's converter (llama-cpp-python 0.3.36 sdist) -----

# Upstream picks tokenizer.ggml.pre by hashing how the real vocabulary encodes a probe text, which
# a test vocabulary cannot reproduce; the real Qwen3.5 tokenizer hashes to "qwen35" (conversion/
# base.py, get_vocab_base_pre), so the run answers that for the test tokenizer (whose split regex
# is Qwen3.5's). Nothing else is patched.
_UPSTREAM_RUNNER = """\
import runpy, sys
vendor = sys.argv[1]
sys.path.insert(0, vendor)
sys.argv = [vendor + "/convert_hf_to_gguf.py"] + sys.argv[2:]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# Keys only one side writes, or whose value is provenance: upstream's model card guesses
# (general.name from the directory name, capitalised; size label; type) and its
# quantization_version, which it writes for float files too.
UPSTREAM_ONLY_KEYS = {"general.type", "general.size_label", "general.quantization_version"}
DIFFERING_KEYS = {"general.name"}


@pytest.fixture(scope="session")
def upstream_vendor():
    cmd = [sys.executable, str(ROOT / "scripts" / "fetch_llama_cpp_source.py"), "--quiet"]
    if os.environ.get("BONSAI_LLAMA_CPP_SDIST"):
        cmd += ["--sdist", os.environ["BONSAI_LLAMA_CPP_SDIST"]]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip("fetching the llama-cpp-python 0.3.36 sdist timed out")
    if r.returncode != 0:
        pytest.skip("cannot fetch upstream's converter: " + (r.stderr.strip().splitlines() or
                                                            ["(no message)"])[-1])
    return Path(r.stdout.strip().splitlines()[-1])


def convert_upstream(vendor: Path, m: dict, out: Path, outtype: str, *extra: str):
    env = {**os.environ, "PYTHONPATH": str(vendor / "gguf-py"), "NO_LOCAL_GGUF": ""}
    r = subprocess.run([sys.executable, "-c", _UPSTREAM_RUNNER, str(vendor), str(m["dir"]),
                        "--outtype", outtype, "--outfile", str(out), *extra],
                       capture_output=True, text=True, timeout=900, env=env, cwd=out.parent)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def _typed_metadata(path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    return {k: (tuple(t.name for t in f.types), f.contents()) for k, f in r.fields.items()
            if not k.startswith("GGUF.")}


def assert_same_files(ours: Path, theirs: Path) -> None:
    a, b = read_gguf(ours), read_gguf(theirs)
    assert sorted(a.types) == sorted(b.types)
    for n in a.types:
        assert (a.types[n], a.shapes[n]) == (b.types[n], b.shapes[n]), n
        x, y = a.values(n), b.values(n)
        if a.types[n] == "F32":
            # exact, except ssm_a = -exp(A_log): numpy's and torch's float32 exp differ in the
            # last bit for some inputs
            rtol = 2.5e-7 if n.endswith(".ssm_a") else 0
            np.testing.assert_allclose(x, y, rtol=rtol, atol=0, err_msg=n)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-6, err_msg=n)
    ma, mb = _typed_metadata(ours), _typed_metadata(theirs)
    assert set(mb) - set(ma) <= UPSTREAM_ONLY_KEYS      # (both write quantization_version for Q8_0)
    assert set(ma) - set(mb) == set()                    # no bonsai.* keys in these files
    for k in sorted(set(ma) - DIFFERING_KEYS):
        assert ma[k] == mb[k], k


@pytest.mark.slow
@pytest.mark.parametrize("layout,tied,outtype", [
    ("causal", False, "f32"), ("causal", True, "f32"), ("conditional", False, "f32"),
    ("conditional", True, "f16"), ("causal", False, "f16"), ("causal", False, "bf16"),
    ("causal", False, "q8_0")])
def test_same_file_as_upstream_converter(qwen35, upstream_vendor, tmp_path, layout, tied, outtype):
    m = qwen35(tied=tied, layout=layout)
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "upstream.gguf"
    convert_ours(m, ours, outtype)
    # --no-mtp: upstream exports an MTP head as an extra nextn block by default (and refuses a
    # checkpoint without one); this converter writes the text model only
    convert_upstream(upstream_vendor, m, theirs, outtype, "--no-mtp")
    assert_same_files(ours, theirs)


@pytest.mark.slow
def test_upstream_default_adds_the_mtp_block_we_skip(qwen35, upstream_vendor, tmp_path):
    """Documented difference: without --no-mtp upstream appends the MTP head as block N (nextn)."""
    m = qwen35(layout="conditional")
    theirs = tmp_path / "upstream.gguf"
    convert_upstream(upstream_vendor, m, theirs, "f32")
    md = read_gguf(theirs).metadata
    n = m["config"]["text_config"]["num_hidden_layers"]
    assert md["qwen35.block_count"] == n + 1 and md["qwen35.nextn_predict_layers"] == 1
