"""Engine core against an independent numpy forward pass (tests/engine_fixtures.py).

Covers every architecture (llama / qwen2 / qwen3, tied and untied output) in F32, F16, Q8_0 and the
ternary TQ1_0 / TQ2_0 types; FLOAT vs INT8 activations; cached vs uncached, chunked, batched and
multi-sequence decoding; KV sequence operations; seeded sampling; and the bad-input errors.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from engine_fixtures import Cfg, reference_logits, write_model

_core = pytest.importorskip("bonsai_runner._core")
BonsaiError = _core.BonsaiError

RNG = np.random.default_rng(1234)
TOKENS = RNG.integers(3, 300, 48)


def _cfg(arch, wtype="F32", tied=False, big=False, emb_type="F32"):
    c = Cfg(arch=arch, wtype=wtype, tied=tied, emb_type=emb_type)
    if arch == "qwen3":
        c.head_dim = 32  # explicit key_length: n_head * head_dim != n_embd
    if big:  # ternary blocks are 256 wide
        c.n_embd, c.n_ff, c.head_dim, c.n_head, c.n_head_kv = 256, 512, 64, 4, 2
    return c


_models: dict = {}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("engine_models")


def get_model(model_dir, arch, wtype="F32", tied=False, emb_type="F32"):
    key = (arch, wtype, tied, emb_type)
    if key not in _models:
        big = wtype in ("TQ1_0", "TQ2_0")
        cfg = _cfg(arch, wtype, tied, big, emb_type)
        path = model_dir / f"{arch}_{wtype}_{emb_type}_{'tied' if tied else 'untied'}.gguf"
        write_model(path, cfg, seed=zlib.crc32(repr(key).encode()) % 1000)
        _models[key] = (cfg, str(path), _core.Model(str(path)))
    return _models[key]


def ctx_for(model, **kw):
    kw.setdefault("n_ctx", 128)
    kw.setdefault("n_batch", 64)
    kw.setdefault("n_threads", 2)
    kw.setdefault("act_mode", "float")
    return _core.Context(model, **kw)


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# ---------------------------------------------------------------- logits vs the numpy reference
CASES = [(a, t, tied) for a in ("llama", "qwen2", "qwen3") for t in ("F32", "F16", "Q8_0")
         for tied in (False, True)]
CASES += [(a, t, False) for a in ("llama", "qwen2", "qwen3") for t in ("TQ1_0", "TQ2_0")]


@pytest.mark.parametrize("arch,wtype,tied", CASES)
def test_logits_match_reference_float_mode(model_dir, arch, wtype, tied):
    emb = "F16" if wtype in ("F16", "TQ1_0", "TQ2_0") else wtype
    cfg, _, m = get_model(model_dir, arch, wtype, tied, emb)
    assert m.arch == arch and m.hparams["tied_output"] == tied
    toks = TOKENS[:32]
    with ctx_for(m) as ctx:
        got = ctx.decode(toks, logits="all")
    assert got.dtype == np.float32 and got.shape == (len(toks), cfg.n_vocab)
    assert rel_err(got, reference_logits(cfg, toks)) < 1e-3


def test_rope_frequency_factors_and_linear_scaling(tmp_path):
    cfg = write_model(tmp_path / "rope.gguf", Cfg(arch="llama", rope_freqs=True, rope_linear=4.0))
    m = _core.Model(str(tmp_path / "rope.gguf"))
    toks = TOKENS[:40]
    with ctx_for(m) as ctx:
        got = ctx.decode(toks, logits="all")
    assert rel_err(got, reference_logits(cfg, toks)) < 1e-3
    plain = Cfg(arch="llama")
    plain.weights = cfg.weights
    assert rel_err(got, reference_logits(plain, toks)) > 1e-2  # the scaling really changed the result


def _kl(p_logits, q_logits):
    p = np.exp(p_logits - p_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lq = q_logits - q_logits.max(-1, keepdims=True)
    lq = lq - np.log(np.exp(lq).sum(-1, keepdims=True))
    lp = np.log(p)
    return (p * (lp - lq)).sum(-1)


# INT8 activations (per-token absmax, W8A8 / W1.58A8). Tied fixtures have peaked, trained-like
# output distributions: top-1 >= 99% and mean KL <= 1e-3 as the spec asks. Untied random fixtures
# have flat N(0, 1) logits over 300 ids whose top-2 gap is often < 0.02, so a few near-ties flip;
# there the KL bound holds (<= 2e-4 over seeds) and top-1 (>= 0.945 over seeds) is held to 93%.
@pytest.mark.parametrize("arch,wtype,tied,min_top1", [
    ("llama", "Q8_0", True, 0.99), ("qwen2", "F16", True, 0.99), ("qwen3", "Q8_0", True, 0.99),
    ("llama", "TQ2_0", True, 0.99), ("qwen2", "TQ1_0", True, 0.99), ("qwen3", "TQ2_0", True, 0.99),
    ("llama", "TQ1_0", False, 0.93), ("qwen2", "TQ2_0", False, 0.93), ("qwen3", "TQ1_0", False, 0.93)])
def test_int8_mode_agrees_with_reference(model_dir, arch, wtype, tied, min_top1):
    cfg, _, m = get_model(model_dir, arch, wtype, tied, "F16" if wtype != "Q8_0" else wtype)
    toks = np.random.default_rng(7).integers(3, 300, 256)
    with ctx_for(m, n_ctx=256, n_batch=256, act_mode="int8") as ctx:
        got = ctx.decode(toks, logits="all").astype(np.float64)
    ref = reference_logits(cfg, toks)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= min_top1
    kl = _kl(ref, got).mean()
    assert kl <= 1e-3
    if not tied:
        assert kl > 0  # INT8 activations really were used


# ---------------------------------------------------------------- decoding paths agree
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_cached_token_by_token_equals_one_batch(model_dir, arch):
    _, _, m = get_model(model_dir, arch, "Q8_0")
    toks = TOKENS[:24]
    with ctx_for(m) as ctx:
        full = ctx.decode(toks, logits="all")
    with ctx_for(m) as ctx:
        steps = np.concatenate([ctx.decode([t]) for t in toks])
        assert ctx.seq_pos_max(0) == len(toks) - 1
    np.testing.assert_allclose(steps, full, rtol=0, atol=2e-4 * np.abs(full).max())


@pytest.mark.parametrize("flash", [False, True])
def test_int8_decode_bit_identical_across_thread_counts(model_dir, flash):
    # Each output row and attention head is computed by exactly one thread with the same
    # operations whatever the split, so the logits must not depend on the thread count.
    _, _, m = get_model(model_dir, "qwen2", "TQ2_0", True, "F16")
    toks = TOKENS[:20]
    runs = []
    for threads in (1, 2, 3):
        with ctx_for(m, n_threads=threads, act_mode="int8", flash_attn=flash) as ctx:
            prompt = ctx.decode(toks[:12], logits="last")
            steps = [ctx.decode([t], logits="last") for t in toks[12:]]
            runs.append(np.concatenate([prompt] + steps))
    for r in runs[1:]:
        assert np.array_equal(r, runs[0])


def test_chunked_prefill_and_flash_attention_agree(model_dir):
    _, _, m = get_model(model_dir, "qwen2", "F16", False, "F16")
    toks = TOKENS[:40]
    with ctx_for(m) as ctx:
        full = ctx.decode(toks, logits="all")
    with ctx_for(m, n_batch=7) as ctx:
        assert ctx.n_batch == 7
        chunked = ctx.decode(toks, logits="all")
    with ctx_for(m, flash_attn=True) as ctx:
        flash = ctx.decode(toks, logits="all")
    tol = 2e-4 * np.abs(full).max()
    np.testing.assert_allclose(chunked, full, rtol=0, atol=tol)
    np.testing.assert_allclose(flash, full, rtol=0, atol=tol)


def test_q8_0_kv_cache_close_to_f16(model_dir):
    cfg, _, m = get_model(model_dir, "qwen3", "F32")  # head_dim 32: q8_0 blocks fit
    toks = TOKENS[:32]
    with ctx_for(m, type_k="q8_0", type_v="q8_0") as ctx:
        got = ctx.decode(toks, logits="all")
        kv_q8 = ctx.memory_report()["kv_bytes"]
    with ctx_for(m) as ctx:
        kv_f16 = ctx.memory_report()["kv_bytes"]
    assert kv_q8 == pytest.approx(kv_f16 * 34 / 64)
    assert rel_err(got, reference_logits(cfg, toks)) < 2e-2


def test_two_sequences_in_one_batch_match_single_runs(model_dir):
    _, _, m = get_model(model_dir, "llama", "Q8_0")
    a, b = TOKENS[:12], TOKENS[20:29]
    with ctx_for(m) as ctx:
        ra = ctx.decode(a, logits="all")
    with ctx_for(m) as ctx:
        rb = ctx.decode(b, logits="all")
    # interleave the two sequences into one batch
    order = sorted([(i, 0) for i in range(len(a))] + [(i, 1) for i in range(len(b))])
    toks = [(a if s == 0 else b)[i] for i, s in order]
    pos = [i for i, _ in order]
    seqs = [s for _, s in order]
    with ctx_for(m, n_seq_max=2, n_batch=5) as ctx:
        out = ctx.decode(toks, pos=pos, seq_ids=seqs, logits="all")
        # then one more token of each sequence, batched together
        nxt = ctx.decode([5, 6], seq_ids=[0, 1], logits="all")
    got_a = out[[k for k, (_, s) in enumerate(order) if s == 0]]
    got_b = out[[k for k, (_, s) in enumerate(order) if s == 1]]
    tol = 2e-4 * np.abs(ra).max()
    np.testing.assert_allclose(got_a, ra, rtol=0, atol=tol)
    np.testing.assert_allclose(got_b, rb, rtol=0, atol=tol)
    with ctx_for(m) as ctx:
        ref_a = ctx.decode(list(a) + [5], logits="last")[0]
    np.testing.assert_allclose(nxt[0], ref_a, rtol=0, atol=tol)


def test_seq_rm_and_seq_cp(model_dir):
    _, _, m = get_model(model_dir, "qwen3", "F16", False, "F16")
    prefix, tail1, tail2 = TOKENS[:10], TOKENS[10:16], TOKENS[30:36]
    with ctx_for(m) as ctx:
        want1 = ctx.decode(np.concatenate([prefix, tail1]), logits="all")[10:]
    with ctx_for(m) as ctx:
        want2 = ctx.decode(np.concatenate([prefix, tail2]), logits="all")[10:]
    tol = 2e-4 * np.abs(want1).max()
    with ctx_for(m, n_seq_max=2) as ctx:
        ctx.decode(prefix)
        ctx.seq_cp(0, 1)  # share the prefix cells
        used = ctx.memory_report()
        got1 = ctx.decode(tail1, seq_ids=[0] * 6, logits="all")
        got2 = ctx.decode(tail2, seq_ids=[1] * 6, logits="all")
        np.testing.assert_allclose(got1, want1, rtol=0, atol=tol)
        np.testing.assert_allclose(got2, want2, rtol=0, atol=tol)
        # rewrite sequence 0's tail: remove it and decode the other tail in its place
        ctx.seq_rm(0, 10, -1)
        assert ctx.seq_pos_max(0) == 9 and ctx.seq_pos_max(1) == 15
        got = ctx.decode(tail2, seq_ids=[0] * 6, logits="all")
        np.testing.assert_allclose(got, want2, rtol=0, atol=tol)
        ctx.seq_keep(1)
        assert ctx.seq_pos_max(0) == -1 and ctx.seq_pos_max(1) == 15
        ctx.clear()
        assert ctx.seq_pos_max(1) == -1
        assert used["kv_bytes"] > 0
        got = ctx.decode(np.concatenate([prefix, tail1]), logits="all")[10:]
        np.testing.assert_allclose(got, want1, rtol=0, atol=tol)


def test_context_full_then_freed(model_dir):
    _, _, m = get_model(model_dir, "llama", "F32")
    with ctx_for(m, n_ctx=16) as ctx:
        ctx.decode(TOKENS[:16])
        with pytest.raises(BonsaiError, match="context overflow"):
            ctx.decode([3])
        ctx.seq_rm(0, 8, -1)
        assert ctx.decode(TOKENS[:4]).shape == (1, 300)  # positions 8..11


# ---------------------------------------------------------------- sampling
def test_sampling_greedy_seeded_and_filters():
    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32) * 3
    assert _core.Sampler(temp=0).sample(logits) == int(logits.argmax())
    assert _core.Sampler(temp=1.0, top_k=1, seed=1).sample(logits) == int(logits.argmax())
    draws = lambda seed: [s.sample(logits) for s in [_core.Sampler(temp=1.0, top_k=0, top_p=1.0,
                                                                    min_p=0.0, seed=seed)] for _ in range(50)]
    assert draws(42) == draws(42)
    assert draws(42) != draws(43)
    # top-k 5: only the 5 best ids ever appear
    best5 = set(np.argsort(-logits)[:5].tolist())
    s = _core.Sampler(temp=2.0, top_k=5, top_p=1.0, min_p=0.0, seed=0)
    assert {s.sample(logits) for _ in range(300)} <= best5
    # frequencies follow softmax(logits / temp) over the kept set
    small = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    s = _core.Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    counts = np.bincount([s.sample(small) for _ in range(20000)], minlength=3) / 20000
    p = np.exp(small) / np.exp(small).sum()
    np.testing.assert_allclose(counts, p, atol=0.015)
    # min_p 0.5 keeps only ids with p >= 0.5 * p_max: here just the best one
    s = _core.Sampler(temp=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=5)
    assert {s.sample(np.array([0.0, 0.0, 5.0], dtype=np.float32)) for _ in range(100)} == {2}
    # repeat penalty pushes an accepted token below the runner-up
    s = _core.Sampler(temp=0, repeat_penalty=2.0, repeat_last_n=4)
    two = np.array([3.0, 2.0], dtype=np.float32)
    assert s.sample(two) == 0
    s.accept(0)
    assert s.sample(two) == 1
    s.reset()
    assert s.sample(two) == 0


@pytest.mark.parametrize("kw,msg", [({"temp": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                                     ({"top_p": 1.5}, "top_p"), ({"min_p": -0.1}, "min_p"),
                                     ({"repeat_penalty": 0.0}, "repeat_penalty"),
                                     ({"repeat_last_n": -2}, "repeat_last_n"), ({"seed": -5}, "seed")])
def test_sampler_rejects_bad_values(kw, msg):
    with pytest.raises(BonsaiError, match=msg):
        _core.Sampler(**kw)


# ---------------------------------------------------------------- bad input
def test_model_load_errors(tmp_path, model_dir):
    with pytest.raises(BonsaiError):
        _core.Model(str(tmp_path / "missing.gguf"))
    bad = Cfg(arch="gpt2")
    with pytest.raises(BonsaiError, match="llama, qwen2, qwen3 and qwen35"):
        write_model(tmp_path / "gpt2.gguf", bad)
        _core.Model(str(tmp_path / "gpt2.gguf"))


def _rewrite(src, dst, drop=None, reshape=None, extra_kv=None):
    """Copies a fixture GGUF with one tensor dropped / reshaped or one metadata key added."""
    from gguf import GGUFReader, GGUFWriter

    r = GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        if vt.name == "ARRAY":
            et = f.types[1]
            vals = [bytes(f.parts[i]).decode() if et.name == "STRING" else f.parts[i].tolist()[0]
                    for i in f.data]
            w.add_array(f.name, vals)
        elif vt.name == "STRING":
            w.add_string(f.name, bytes(f.parts[-1]).decode())
        else:
            w.add_key_value(f.name, f.parts[-1].tolist()[0], vt)
    for k, v in (extra_kv or {}).items():
        w.add_string(k, v)
    for t in r.tensors:
        if t.name == drop:
            continue
        data = np.array(t.data)
        if t.name == reshape:
            data = data.reshape(-1)[: data.size // 2].reshape(-1, data.shape[-1])
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_model_validation_names_the_tensor(tmp_path, model_dir):
    _, src, _ = get_model(model_dir, "llama", "F32")
    _rewrite(src, tmp_path / "drop.gguf", drop="blk.1.ffn_up.weight")
    with pytest.raises(BonsaiError, match="blk.1.ffn_up.weight"):
        _core.Model(str(tmp_path / "drop.gguf"))
    _rewrite(src, tmp_path / "shape.gguf", reshape="blk.0.attn_k.weight")
    with pytest.raises(BonsaiError, match=r"blk.0.attn_k.weight.*shape"):
        _core.Model(str(tmp_path / "shape.gguf"))
    # rotated files run (tests/test_hadamard.py); a partial contract is refused, never run unrotated
    _rewrite(src, tmp_path / "had.gguf", extra_kv={"prism.hadamard.block_size": "128"})
    with pytest.raises(BonsaiError, match="no prism.hadamard.version"):
        _core.Model(str(tmp_path / "had.gguf"))


def test_context_and_decode_errors(model_dir):
    _, _, m = get_model(model_dir, "llama", "F32")
    for kw, msg in [({"n_ctx": 0}, "n_ctx"), ({"n_batch": 0}, "n_batch"), ({"n_seq_max": 0}, "n_seq_max"),
                    ({"n_seq_max": 65}, "n_seq_max"), ({"type_k": "q4_0"}, "cache type"),
                    ({"type_v": "bogus"}, "cache type"), ({"type_k": "q8_0"}, "multiple of 32"),
                    ({"act_mode": "int4"}, "act_mode"), ({"n_threads": -1}, "n_threads"),
                    ({"n_ctx": 2_000_000_000}, "available")]:
        with pytest.raises(BonsaiError, match=msg):
            ctx_for(m, **kw)
    ctx = ctx_for(m, n_seq_max=2)
    for args, kw, msg in [(([],), {}, "empty"), (([300],), {}, "vocabulary"), (([-1],), {}, "vocabulary"),
                          (([1, 2],), {"seq_ids": [0, 2]}, "sequence id"),
                          (([1, 2],), {"pos": [0, -1]}, "negative"),
                          (([1, 2],), {"pos": [3, 3]}, "increase"), (([1, 2],), {"pos": [0]}, "length"),
                          (([1, 2],), {"logits": "some"}, "logits"), (([1, 2],), {"logits": [1]}, "mask")]:
        with pytest.raises(BonsaiError, match=msg):
            ctx.decode(*args, **kw)
    ctx.decode([1, 2, 3])
    with pytest.raises(BonsaiError, match="increase"):
        ctx.decode([4], pos=[1])
    with pytest.raises(BonsaiError, match="sequence id"):
        ctx.seq_cp(0, 5)
    ctx.close()
    with pytest.raises(BonsaiError, match="closed"):
        ctx.decode([1])
    m2 = _core.Model(_models[("llama", "F32", False, "F32")][1])
    c2 = ctx_for(m2)
    m2.close()  # the context keeps the weights alive
    assert c2.decode([1, 2]).shape == (1, 300)
    with pytest.raises(BonsaiError, match="closed"):
        m2.n_vocab


def test_model_properties(model_dir):
    cfg, _, m = get_model(model_dir, "qwen3", "Q8_0")
    hp = m.hparams
    assert (hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]) == (64, 4, 2, 32)
    assert m.n_vocab == 300 and m.n_ctx_train == 512 and m.bos == 1 and m.eos == 2
    assert m.metadata["general.architecture"] == "qwen3"
    rep = m.memory_report()
    assert rep["weights_by_type"]["Q8_0"] > 0 and rep["weights_bytes"] == sum(rep["weights_by_type"].values())
    assert "layer   1: CPU" in m.layer_table()
    ids = m.tokenize("ab", add_special=True)
    assert ids[0] == 1
    assert m.detokenize(ids[1:]) == b"ab"


def _huge_pages_available():
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


@pytest.mark.parametrize("tied", [False, True])
def test_streamed_weights_copied_into_huge_pages(model_dir, tied):
    # By default the layer matrices and the output head (the tied embedding once) are copied out of
    # the file mapping into huge pages; the copy must decode to the same bits as the mapping and as
    # the file read into memory, and --no-huge-pages / --no-mmap make no copy.
    from bonsai_runner.gguf_reader import open_gguf

    _, path, m = get_model(model_dir, "llama", "Q8_0", tied)
    plain = _core.Model(path, huge_pages=False)
    in_memory = _core.Model(path, use_mmap=False)
    streamed = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    with open_gguf(path) as g:
        want = sum((t.nbytes + 63) // 64 * 64 for t in g.tensors
                   if t.name.split(".")[-2] in streamed or t.name == ("token_embd.weight" if tied else "output.weight"))
    assert m.memory_report()["huge_page_bytes"] == (want if _huge_pages_available() else 0)
    assert plain.memory_report()["huge_page_bytes"] == 0 and in_memory.memory_report()["huge_page_bytes"] == 0
    runs = []
    for model in (m, plain, in_memory):
        with ctx_for(model, act_mode="int8") as ctx:
            runs.append(np.concatenate([ctx.decode(TOKENS[:8], logits="last")] +
                                       [ctx.decode([t], logits="last") for t in TOKENS[8:14]]))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize("head_type", ["PTQ1_0", "Q8_0"])
def test_repacked_weights_decode_to_the_same_bits(tmp_path, head_type):
    # On the AVX-512 path the PTQ1_0 matrices of 1024 or more columns (here every linear weight: 9
    # blocks a row, one 8-block group and one block more) are regrouped and the Q8_0 ones (the head;
    # 514 rows, two past the last 4-row tile) interleaved while they are copied into huge pages
    # (backends/cpu/repack.h); prompts (the GEMM) and single tokens must decode to the bits of the
    # weights in the file's order, with INT8 and float activations.
    from bonsai_runner.gguf_reader import open_gguf
    from synthetic_gguf import write_synthetic_model

    path = str(write_synthetic_model(tmp_path / "rp.gguf", "llama", hidden=1152, ffn=1024, n_layer=2, n_head=9,
                                     n_head_kv=3, vocab=514, wtype="PTQ1_0", emb_type="F16", head_type=head_type))
    # A file read into memory (use_mmap=False) is repacked in place, with or without huge pages.
    repacked, plain = _core.Model(path), _core.Model(path, repack=False)
    in_memory = _core.Model(path, use_mmap=False)
    with open_gguf(path) as g:
        want = sum(t.nbytes for t in g.tensors if (t.type_name == "PTQ1_0" and t.ne[0] >= 1024) or t.type_name == "Q8_0")
    assert want > 0
    avx512 = _core.cpu_path() == "avx512"
    assert repacked.memory_report()["repacked_bytes"] == (want if avx512 and _huge_pages_available() else 0)
    assert in_memory.memory_report()["repacked_bytes"] == (want if avx512 else 0)
    assert plain.memory_report()["repacked_bytes"] == 0
    for act_mode in ("int8", "float"):
        runs = []
        for model in (repacked, plain, in_memory):
            with ctx_for(model, act_mode=act_mode) as ctx:
                runs.append(np.concatenate([ctx.decode(TOKENS[:9], logits="all")] +
                                           [ctx.decode([t], logits="last") for t in TOKENS[9:15]]))
        assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2]), act_mode


# ---------------------------------------------------------------- bonsai_run
def _greedy_text(model, prompt, n):
    ids = model.tokenize(prompt, add_special=True, parse_special=True)
    out = []
    with ctx_for(model, act_mode="int8") as ctx:
        logits = ctx.decode(ids)[0]
        for _ in range(n):
            t = int(logits.argmax())
            if t == model.eos:
                break
            out.append(t)
            logits = ctx.decode([t])[0]
    return b"".join(model.token_to_piece(t) for t in out)


def _run(*args, stdin=None):
    """bonsai_run with bytes stdout (random fixtures emit arbitrary bytes) and text stderr."""
    import subprocess

    from conftest import bonsai_run_path

    p = subprocess.run([bonsai_run_path(), *map(str, args)], input=stdin, capture_output=True, timeout=60)
    p.stderr = p.stderr.decode("utf-8", "replace")
    return p


def test_bonsai_run_generates_greedy_text(model_dir):
    _, path, m = get_model(model_dir, "qwen2", "Q8_0")
    p = _run("-m", path, "-p", "ab abc", "-n", "12", "--temp", "0", "-t", "2", "-c", "256")
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"ab abc" + _greedy_text(m, "ab abc", 12)
    for needle in ("layer   1: CPU", "KV cache", "compute buffers", "timing: load", "tokens/s"):
        assert needle in p.stderr


def test_bonsai_run_seeded_sampling_is_reproducible(model_dir):
    _, path, _ = get_model(model_dir, "llama", "F16", False, "F16")
    args = ("-m", path, "-p", "abc", "-n", "16", "--temp", "1.0", "--seed", "7", "-t", "1", "-c", "128")
    a, b = _run(*args), _run(*args)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_bonsai_run_chat_mode(model_dir):
    _, path, _ = get_model(model_dir, "qwen3", "F32")
    p = _run("-m", path, "-i", "-n", "4", "--temp", "0", "-c", "256", "-t", "1", stdin=b"hello\nabc\n/exit\n")
    assert p.returncode == 0, p.stderr
    assert "chat mode (plain turns)" in p.stderr and p.stderr.count("> ") >= 3


@pytest.mark.parametrize("extra,msg", [
    (("-p", ""), "prompt is empty"), ((), "no prompt"), (("-p", "a", "-n", "0"), "n-predict"),
    (("-p", "a", "--temp", "-1"), "temp"), (("-p", "a", "--top-p", "2"), "top"),
    (("-p", "ab " * 40, "-c", "16"), "context"), (("-p", "a", "--cache-type-k", "q4_0"), "cache-type-k"),
    (("-p", "a", "--parallel", "2"), "parallel"), (("-p", "a", "--min-p", "1.5"), "min")])
def test_bonsai_run_bad_input(model_dir, extra, msg):
    _, path, _ = get_model(model_dir, "llama", "F32")
    p = _run("-m", path, *extra, "-t", "1")
    assert p.returncode not in (0, -11, -6), p.stderr
    err = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and msg in err[0].lower(), p.stderr


def test_bonsai_run_bad_model(tmp_path):
    write_model(tmp_path / "gpt2.gguf", Cfg(arch="gpt2"))
    for path, msg in [(tmp_path / "gpt2.gguf", "llama, qwen2, qwen3 and qwen35"), (tmp_path / "nope.gguf", "nope.gguf")]:
        p = _run("-m", path, "-p", "hi")
        assert p.returncode == 1
        err = [ln for ln in p.stderr.splitlines() if "error" in ln]
        assert len(err) == 1 and msg in err[0], p.stderr


# ---------------------------------------------------------------- the project's numpy reference
@pytest.mark.parametrize("arch,wtype,tied", [("llama", "F16", False), ("qwen2", "Q8_0", True),
                                             ("qwen3", "TQ2_0", False), ("llama", "TQ1_0", False)])
def test_logits_match_reference_model(model_dir, arch, wtype, tied):
    """Engine logits vs bonsai_runner.reference.ReferenceModel (float64 numpy) on the same file."""
    reference = pytest.importorskip("bonsai_runner.reference")
    emb = "F16" if wtype != "Q8_0" else wtype
    _, path, m = get_model(model_dir, arch, wtype, tied, emb)
    toks = TOKENS[:24]
    ref = reference.ReferenceModel.from_gguf(path).logits(toks)
    with ctx_for(m) as ctx:
        got = ctx.decode(toks, logits="all")
    assert rel_err(got, ref) < 1e-3


# ---------------------------------------------------------------- HF checkpoint -> bonsai convert -> engine
_HF_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
             "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def _cfg_from_hf(facts) -> Cfg:
    c = facts["config"]
    cfg = Cfg(arch=facts["arch"], n_vocab=facts["n_vocab"], n_embd=c["hidden_size"], n_layer=c["num_hidden_layers"],
              n_head=c["num_attention_heads"], n_head_kv=c["num_key_value_heads"], head_dim=facts["head_dim"],
              n_ff=c["intermediate_size"], eps=c["rms_norm_eps"], theta=c["rope_theta"], tied=facts["tied"])
    w = {}
    for name, x in facts["tensors"].items():
        x = np.asarray(x, dtype=np.float64)
        if name == "model.embed_tokens.weight":
            w["token_embd.weight"] = x
        elif name == "model.norm.weight":
            w["output_norm.weight"] = x
        elif name == "lm_head.weight":
            w["output.weight"] = x
        else:
            i, rest = name[len("model.layers."):].split(".", 1)
            w[f"blk.{i}.{_HF_NAMES[rest]}"] = x
    cfg.weights = w
    return cfg


@pytest.mark.parametrize("arch,ternary,tokenizer,tied", [("llama", True, "spm", False), ("qwen2", True, "bpe", True),
                                                          ("qwen3", True, "bpe", False), ("llama", False, "spm", True)])
def test_converted_hf_checkpoint_matches_hf_semantics(tmp_path, arch, ternary, tokenizer, tied):
    """A Hugging Face checkpoint through `bonsai convert` (ternary -> PTQ1_0, float -> F16) runs in the
    engine like the HF model computes (rotate_half rope on unpermuted weights, float64 numpy)."""
    mf = pytest.importorskip("model_factory")
    from conftest import run_cli

    hidden = 256 if ternary else 64
    facts = mf.make_hf_model(tmp_path / "hf", arch=arch, hidden=hidden, ffn=2 * hidden, ternary=ternary,
                             tokenizer=tokenizer, tied=tied, dtype="float16", seed=3)
    out = tmp_path / "m.gguf"
    args = [str(tmp_path / "hf"), "--outfile", str(out), "--no-progress"]
    if not ternary:
        args += ["--outtype", "f16"]
    run_cli("convert", *args, check=True)
    m = _core.Model(str(out))
    want_type = "PTQ1_0" if ternary else "F16"
    assert want_type in m.memory_report()["weights_by_type"]
    cfg = _cfg_from_hf(facts)
    toks = np.random.default_rng(5).integers(3, facts["n_vocab"], 32)
    with ctx_for(m) as ctx:
        got = ctx.decode(toks, logits="all")
    ref = reference_logits(cfg, toks)
    assert rel_err(got, ref) < 1e-3
    with ctx_for(m, act_mode="int8") as ctx:
        got8 = ctx.decode(toks, logits="all").astype(np.float64)
    assert _kl(ref, got8).mean() <= 1e-3
    ids = m.tokenize("hello world", add_special=False)
    assert m.detokenize(ids) == b"hello world"
