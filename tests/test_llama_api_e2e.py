"""End-to-end tests of `bonsai_runner.Llama` on the native engine: a tiny random llama-architecture
GGUF (F32 weights, byte-level BPE vocabulary trained here with `tokenizers`, ChatML template) checked
against llama-cpp-python running the same file, and tiny Hugging Face models (tests/model_factory.py)
converted by `bonsai convert`. Every test skips when the engine is not built."""

from __future__ import annotations

import numpy as np
import pytest

from bonsai_runner.chat_template import ChatTemplate
from bonsai_runner.completion_format import log_softmax
from bonsai_runner.errors import BonsaiError

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _has_engine() -> bool:
    try:
        from bonsai_runner import _core
    except ImportError:
        return False
    return all(hasattr(_core, n) for n in ("Model", "Context", "Sampler"))


engine = pytest.mark.skipif(not _has_engine(), reason="needs the native engine (scripts/dev_build.sh)")


def write_tiny_gguf(path, seed: int = 0, user_tokens: tuple = (), chat_template: str = None) -> None:
    """Writes a 2-layer, hidden-64 llama model with a ~320-token byte-level BPE vocabulary;
    `user_tokens` are added as user-defined tokens (e.g. <tool_call>), `chat_template` replaces ChatML."""
    import json

    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials + list(user_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["The answer is 42. Hello world, hello there! 你好世界 🙂 def add(a, b): "
                             "return a + b"] * 20, trainer)
    spec = json.loads(tok.to_str())["model"]
    tokens = [None] * len(spec["vocab"])
    for text, i in spec["vocab"].items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer = len(tokens), 64, 128, 4, 2, 2
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 4 if t in user_tokens else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template or CHATML)

    def mat(name, rows, cols, scale=None):
        scale = scale if scale is not None else 1 / np.sqrt(cols)
        w.add_tensor(name, (rng.standard_normal((rows, cols)) * scale).astype(np.float32))

    mat("token_embd.weight", n_vocab, n_embd, 1.0)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        mat(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        mat(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        mat(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
        mat(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
        mat(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        mat(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        mat(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    mat("output.weight", n_vocab, n_embd, 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_api") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


@pytest.fixture
def real_llama(tiny_gguf):
    from bonsai_runner import Llama

    made = []

    def make(**kw):
        kw.setdefault("n_ctx", 128)
        kw.setdefault("verbose", False)
        m = Llama(tiny_gguf, **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def _rows_close(a: np.ndarray, b: np.ndarray, tol: float = 0.05) -> None:
    """Logit rows agree up to activation-quantization noise: small error relative to their spread."""
    a, b = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    assert a.shape == b.shape
    err = np.abs(a - b).max(axis=1)
    spread = b.std(axis=1)
    assert np.all(err <= tol * spread + 1e-4), f"max error {err} vs spread {spread}"


@engine
def test_e2e_greedy_completion_deterministic_and_reuses_prefix(real_llama):
    llm = real_llama()
    a = llm("The answer is", max_tokens=12, temperature=0)
    assert a["object"] == "text_completion" and a["choices"][0]["finish_reason"] in ("length", "stop")
    b = llm("The answer is", max_tokens=12, temperature=0)
    assert b["choices"][0]["text"] == a["choices"][0]["text"] and b["usage"] == a["usage"]
    c = real_llama()("The answer is", max_tokens=12, temperature=0)
    assert c["choices"][0]["text"] == a["choices"][0]["text"]
    assert llm.n_ctx() == 128 and llm.n_vocab() == llm._model.n_vocab
    assert real_llama(n_ctx=0).n_ctx() == 256


@engine
def test_e2e_logits_all_scores_match_engine_and_cached_decoding(real_llama, tiny_gguf):
    from bonsai_runner import _core

    llm = real_llama(logits_all=True, n_batch=5)
    toks = llm.tokenize(b"Hello world, hello there! The answer is 42.")
    llm.eval(toks)
    model = _core.Model(tiny_gguf)
    ctx = _core.Context(model, n_ctx=128, n_batch=64)
    try:
        direct = ctx.decode(toks, pos=list(range(len(toks))), logits="all")
    finally:
        ctx.close()
        model.close()
    _rows_close(llm.scores[: len(toks)], direct)
    # the prefix kept from that evaluation gives the same logits as a fresh evaluation
    llm("Hello world, hello again", max_tokens=1, temperature=0)
    fresh = real_llama(logits_all=True)
    fresh.eval(llm.input_ids[: llm.n_tokens].tolist())
    _rows_close(llm.scores[: llm.n_tokens], fresh.scores[: fresh.n_tokens])


@engine
def test_e2e_agrees_with_llama_cpp(real_llama, tiny_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(tiny_gguf, n_ctx=128, logits_all=True, verbose=False)
    text = b"def add(a, b): return a + b"
    toks = ref.tokenize(text)
    ref.eval(toks)
    exact = real_llama(logits_all=True, act_mode="float")
    exact.eval(toks)
    _rows_close(exact.scores[: len(toks)], ref.scores[: len(toks)], tol=1e-3)
    llm = real_llama(logits_all=True)  # INT8 activations: close, not equal
    llm.eval(toks)
    _rows_close(llm.scores[: len(toks)], ref.scores[: len(toks)], tol=0.1)
    assert llm.detokenize(toks) == ref.detokenize(toks)
    assert llm.tokenize(text) == toks


def _shape(obj):
    """The structure of a response: dict keys and value types, recursively (values left out)."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shape(v) for v in obj[:1]]
    return type(obj).__name__


@engine
def test_e2e_response_shapes_match_llama_cpp(real_llama, tiny_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(tiny_gguf, n_ctx=128, verbose=False)
    llm = real_llama()
    kw = dict(max_tokens=3, temperature=0)
    assert _shape(llm("Hello", **kw)) == _shape(ref("Hello", **kw))
    mine, theirs = list(llm("Hello", stream=True, **kw)), list(ref("Hello", stream=True, **kw))
    assert _shape(mine[0]) == _shape(theirs[0]) and _shape(mine[-1]) == _shape(theirs[-1])
    msgs = [{"role": "user", "content": "Hello"}]
    assert _shape(llm.create_chat_completion(msgs, **kw)) == _shape(ref.create_chat_completion(msgs, **kw))
    mine = list(llm.create_chat_completion(msgs, stream=True, **kw))
    theirs = list(ref.create_chat_completion(msgs, stream=True, **kw))
    for i in (0, 1, -1):
        assert _shape(mine[i]) == _shape(theirs[i])


@engine
def test_e2e_stream_equals_non_stream_stop_and_echo(real_llama):
    llm = real_llama()
    full = llm("Hello", max_tokens=16, temperature=0)["choices"][0]["text"]
    chunks = list(llm("Hello", max_tokens=16, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    stop = full[len(full) // 2: len(full) // 2 + 2]
    if stop.strip():
        r = llm("Hello", max_tokens=16, temperature=0, stop=[stop])
        assert r["choices"][0]["text"] == full[: full.index(stop)]
        assert r["choices"][0]["finish_reason"] == "stop"
        s = "".join(c["choices"][0]["text"] for c in llm("Hello", max_tokens=16, temperature=0, stop=stop, stream=True))
        assert s == r["choices"][0]["text"]
    e = llm("Hello", max_tokens=16, temperature=0, echo=True)
    assert e["choices"][0]["text"] == "Hello" + full


@engine
def test_e2e_logprobs(real_llama):
    llm = real_llama(logits_all=True)
    r = llm("The answer", max_tokens=4, temperature=0, logprobs=2)
    lp = r["choices"][0]["logprobs"]
    n_prompt = r["usage"]["prompt_tokens"]
    n = r["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
    toks = llm.input_ids[: n_prompt + n - 1]
    for i in range(n):
        row = log_softmax(llm.scores[n_prompt - 1 + i])
        assert lp["token_logprobs"][i] == pytest.approx(row.max(), abs=1e-4)  # greedy: the top token
        assert i == n - 1 or int(toks[n_prompt + i]) == int(np.argmax(row))
    e = llm("The answer", max_tokens=2, temperature=0, logprobs=1, echo=True)["choices"][0]["logprobs"]
    n_bos = 1 if llm._add_bos else 0  # an echoed prompt leaves out the BOS the tokenizer added
    assert e["token_logprobs"][0] is None and len(e["tokens"]) == n_prompt - n_bos + 2


@engine
def test_e2e_chat_completion_uses_file_template(real_llama):
    llm = real_llama()
    msgs = [{"role": "user", "content": "Hello there!"}]
    r = llm.create_chat_completion(msgs, max_tokens=6, temperature=0)
    rendered = ChatTemplate(CHATML).render(msgs)
    prompt = llm.tokenize(rendered.encode(), add_bos=False, special=True)
    if llm._add_bos:
        prompt.insert(0, llm.token_bos())
    assert r["usage"]["prompt_tokens"] == len(prompt)
    plain = llm(prompt, max_tokens=6, temperature=0, stop=["<|im_end|>"])
    assert r["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
    chunks = list(llm.create_chat_completion(msgs, max_tokens=6, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        r["choices"][0]["message"]["content"]


@engine
def test_e2e_close_and_bad_input(real_llama, tiny_gguf):
    from bonsai_runner import Llama

    with Llama(tiny_gguf, n_ctx=32, verbose=False) as llm:
        with pytest.raises(BonsaiError, match="does not fit the context"):
            llm("hello " * 40)
        with pytest.raises(BonsaiError, match="prompt is empty"):
            llm("")
        with pytest.raises(BonsaiError, match="temperature"):
            llm("hi", temperature=-1)
        with pytest.raises(BonsaiError, match="top_p"):
            llm("hi", top_p=2)
        with pytest.raises(BonsaiError, match="max_tokens"):
            llm("hi", max_tokens="3")
        with pytest.raises(BonsaiError, match="invalid token id"):
            llm([10**6])
    with pytest.raises(BonsaiError, match="closed"):
        llm("hi")
    with pytest.raises(BonsaiError, match="KV cache type"):
        Llama(tiny_gguf, type_k="q5_1", verbose=False)
    with pytest.raises(BonsaiError, match="not found"):
        Llama(tiny_gguf + ".missing", verbose=False)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Tiny Hugging Face models (tests/model_factory.py) converted by `bonsai convert`: a ternary
    llama with a SentencePiece tokenizer (-> PTQ1_0) and a qwen2 with a byte-level BPE (ChatML)."""
    from conftest import run_cli
    from model_factory import make_hf_model

    out = {}
    for name, kw in {"spm": dict(arch="llama", tokenizer="spm", ternary=True, hidden=128, ffn=256),
                     "bpe": dict(arch="qwen2", tokenizer="bpe")}.items():
        d = tmp_path_factory.mktemp(f"hf_{name}")
        facts = make_hf_model(d / "model", **kw)
        gguf_path = d / "model.gguf"
        run_cli("convert", d / "model", "--outfile", gguf_path, "--no-progress", check=True)
        out[name] = (str(gguf_path), facts)
    return out


@engine
@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_e2e_converted_model_chat_and_completion(converted, kind):
    from bonsai_runner import Llama, _core

    path, facts = converted[kind]
    with Llama(path, n_ctx=256, logits_all=True, verbose=False) as llm:
        assert not llm._chat.is_fallback and llm._chat.source == facts["tokens"]["chat_template"]
        assert facts["tokens"]["eos"] in llm._eog
        if kind == "bpe":  # <|endoftext|> ends generation too, as in llama.cpp
            assert facts["tokens"]["pad"] in llm._eog
        msgs = [{"role": "user", "content": "Hello world, 你好"}]
        r = llm.create_chat_completion(msgs, max_tokens=8, temperature=0)
        expected = ChatTemplate(facts["tokens"]["chat_template"], bos_token=llm._token_text(llm.token_bos()),
                                eos_token=llm._token_text(llm.token_eos())).render(msgs)
        prompt = llm.tokenize(expected.encode(), add_bos=False, special=True)
        if llm._add_bos and prompt[:1] != [llm.token_bos()]:
            prompt.insert(0, llm.token_bos())
        assert prompt.count(llm.token_bos()) <= 1 or llm.token_bos() < 0  # no doubled BOS
        assert r["usage"]["prompt_tokens"] == len(prompt)
        streamed = "".join(c["choices"][0]["delta"].get("content", "")
                           for c in llm.create_chat_completion(msgs, max_tokens=8, temperature=0, stream=True))
        assert streamed == r["choices"][0]["message"]["content"]
        # the scores kept with logits_all are the engine's own per-position logits
        toks = llm.input_ids[: llm.n_tokens].tolist()
        model = _core.Model(path)
        ctx = _core.Context(model, n_ctx=256)
        try:
            direct = ctx.decode(toks, logits="all")
        finally:
            ctx.close()
            model.close()
        _rows_close(llm.scores[: len(toks)], direct, tol=1e-5)
        a = llm("The quick brown fox", max_tokens=10, temperature=0)
        b = llm("The quick brown fox", max_tokens=10, temperature=0)
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["usage"]["prompt_tokens"] == len(llm.tokenize(b"The quick brown fox"))
