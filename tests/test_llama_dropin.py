"""`bonsai_runner.Llama` as a drop-in for llama-cpp-python 0.3.x (issue #18 item 5), on the tiny
random llama GGUF of test_llama_api_e2e and a tiny random qwen35 (tests/qwen35_factory.py):

- every llama-cpp-python constructor keyword is accepted at its default without a warning; those
  with no effect here warn once when set, those that would change results are a ValueError;
  misspelled keywords (constructor and calls) are a TypeError suggesting the right name;
- chat template variables come through chat_template_kwargs= only;
- type_k / type_v as GGML type ids; chat_format= names;
- save_state / load_state: a continuation after load_state equals the one without the save
  (llama and qwen35, whose recurrent state is saved too), and foreign states are refused;
- token_nl; from_pretrained from an offline Hugging Face cache laid out by hand.
"""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest

from test_llama_api_e2e import engine, write_tiny_gguf

# llama-cpp-python 0.3.x's Llama.__init__ keywords and defaults (model_path aside).
LLAMA_CPP_DEFAULTS = dict(
    n_gpu_layers=0, split_mode=1, main_gpu=0, tensor_split=None, rpc_servers=None, vocab_only=False,
    use_mmap=True, use_mlock=False, kv_overrides=None, seed=0xFFFFFFFF, n_ctx=512, n_batch=512, n_ubatch=512,
    n_threads=None, n_threads_batch=None, rope_scaling_type=-1, pooling_type=-1, rope_freq_base=0.0,
    rope_freq_scale=0.0, yarn_ext_factor=-1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0,
    yarn_orig_ctx=0, logits_all=False, embedding=False, offload_kqv=True, flash_attn=False, op_offload=None,
    swa_full=None, no_perf=False, last_n_tokens_size=64, lora_base=None, lora_scale=1.0, lora_path=None,
    numa=False, chat_format=None, chat_handler=None, draft_model=None, tokenizer=None, type_k=None,
    type_v=None, spm_infill=False, verbose=False)

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("dropin") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


@pytest.fixture(scope="module")
def llm(tiny):
    from bonsai_runner import Llama

    m = Llama(tiny, n_ctx=256, verbose=False)
    yield m
    m.close()


def _greedy(llm, prompt="Hello world", n=12, **kw):
    return llm(prompt, max_tokens=n, temperature=0, **kw)["choices"][0]["text"]


# ---- constructor keywords -----------------------------------------------------------------

@engine
def test_every_llama_cpp_keyword_at_its_default_is_silent(tiny, llm):
    from bonsai_runner import Llama

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Llama(tiny, **LLAMA_CPP_DEFAULTS)
    try:
        assert m.n_ctx() == 512 and m.chat_format is None and m._embedding is False and m.pooling_type() == -1
        assert _greedy(m) == _greedy(llm)
    finally:
        m.close()


@engine
@pytest.mark.parametrize("name, value", [
    ("use_mlock", True), ("numa", True), ("offload_kqv", False), ("n_ubatch", 64), ("split_mode", 0),
    ("main_gpu", 1), ("tensor_split", [0.5, 0.5]), ("vocab_only", True), ("yarn_ext_factor", 0.5),
    ("lora_scale", 0.5), ("op_offload", True), ("swa_full", True), ("n_threads_batch", 3)])
def test_keywords_without_effect_warn_once_and_change_nothing(tiny, llm, name, value):
    from bonsai_runner import Llama

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = Llama(tiny, n_ctx=256, verbose=False, **{name: value})
    try:
        mine = [w for w in caught if name in str(w.message)]
        assert len(mine) == 1 and len(caught) == 1, [str(w.message) for w in caught]
        assert "no effect" in str(mine[0].message) and mine[0].filename == __file__
        assert _greedy(m) == _greedy(llm)
    finally:
        m.close()


@engine
@pytest.mark.parametrize("name, value", [
    ("lora_path", "adapter.gguf"), ("lora_base", "base.gguf"), ("kv_overrides", {"llama.context_length": 64}),
    ("draft_model", object()), ("chat_handler", object()), ("rope_scaling_type", 1),
    ("rope_freq_base", 5000.0), ("rope_freq_scale", 0.5)])
def test_keywords_that_would_change_results_are_refused(tiny, name, value):
    from bonsai_runner import Llama

    with pytest.raises(ValueError, match=name):
        Llama(tiny, n_ctx=256, verbose=False, **{name: value})


@engine
def test_the_models_own_rope_values_are_accepted(tiny, llm):
    from bonsai_runner import Llama

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Llama(tiny, n_ctx=256, verbose=False, rope_freq_base=10000.0, rope_freq_scale=1.0, kv_overrides={})
    try:
        assert _greedy(m) == _greedy(llm)
    finally:
        m.close()


@engine
def test_misspelled_keywords_are_type_errors_with_a_suggestion(tiny, llm):
    from bonsai_runner import Llama

    with pytest.raises(TypeError, match=r"'n_ctxx'.*did you mean 'n_ctx'"):
        Llama(tiny, n_ctxx=256)
    with pytest.raises(TypeError, match=r"'use_mlok'.*did you mean 'use_mlock'"):
        Llama(tiny, use_mlok=True)
    for call in (lambda: llm.create_completion("Hi", temprature=0), lambda: llm("Hi", temprature=0),
                 lambda: llm.create_chat_completion(MSGS, temprature=0)):
        with pytest.raises(TypeError, match=r"'temprature'.*did you mean 'temperature'"):
            call()
    with pytest.raises(TypeError, match=r"generate\(\) got an unexpected keyword argument 'temprature'; did you "
                                        r"mean 'temp'"):
        llm.generate([1, 2], temprature=0)
    with pytest.raises(TypeError, match=r"'enable_thinking'"):  # template variables need chat_template_kwargs
        llm.create_chat_completion(MSGS, enable_thinking=False)
    with pytest.raises(TypeError, match="'zzz'"):
        llm("Hi", zzz=1)


@engine
def test_unimplemented_sampling_keywords(llm):
    with pytest.raises(ValueError, match="mirostat_mode"):
        llm("Hi", max_tokens=2, mirostat_mode=2)
    with pytest.raises(ValueError, match="typical_p"):
        llm.create_chat_completion(MSGS, max_tokens=2, typical_p=0.5)
    with pytest.raises(ValueError, match="grammar"):
        llm("Hi", max_tokens=2, grammar="root ::= x")
    with pytest.raises(ValueError, match="response_format"):
        llm.create_chat_completion(MSGS, max_tokens=2, response_format={"type": "xml"})
    # llama-cpp-python's defaults pass, positionally too (its parameter order)
    a = llm.create_completion("Hello world", None, 6, 0.0, 0.95, 0.05, 1.0, None, False, [], 0.0, 0.0, 1.0, 40)
    assert a["choices"][0]["text"] == _greedy(llm, n=6)
    r = llm.create_chat_completion(MSGS, max_tokens=3, temperature=0, tool_choice="auto",
                                   response_format={"type": "text"}, mirostat_tau=5.0, tfs_z=1.0)
    assert r["object"] == "chat.completion"


@engine
def test_spm_infill_puts_the_suffix_first(tiny):
    from bonsai_runner import Llama

    fim = {"tokenizer.ggml.fim_pre_token_id": 10, "tokenizer.ggml.fim_suf_token_id": 11,
           "tokenizer.ggml.fim_mid_token_id": 12}
    for spm, order in ((False, "psm"), (True, "spm")):
        m = Llama(tiny, n_ctx=64, verbose=False, spm_infill=spm)
        try:
            m.metadata = {**m.metadata, **fim}
            pre, suf = m.tokenize(b"def add(a, b):", add_bos=False), m.tokenize(b" return a + b", add_bos=False)
            toks, placed = m._prompt_tokens("def add(a, b):", " return a + b")
            want = [10] + pre + [11] + suf + [12] if order == "psm" else [11] + suf + [10] + pre + [12]
            assert placed and toks == want
            assert m("def add(a, b):", suffix=" return a + b", max_tokens=2, temperature=0)["usage"][
                "prompt_tokens"] == len(want)
        finally:
            m.close()


@engine
def test_chat_template_kwargs(tiny):
    from bonsai_runner import Llama

    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n{% if greeting is defined %}{{ greeting }}{% endif %}")
    m = Llama(tiny, n_ctx=256, verbose=False, chat_template=template)
    try:
        plain = m.create_chat_completion(MSGS, max_tokens=6, temperature=0)
        greeted = m.create_chat_completion(MSGS, max_tokens=6, temperature=0,
                                           chat_template_kwargs={"greeting": "The answer is"})
        assert greeted["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
        with pytest.raises(ValueError, match="chat_template_kwargs"):
            m.create_chat_completion(MSGS, chat_template_kwargs=["greeting"])
        with pytest.raises(ValueError, match="messages"):
            m.create_chat_completion(MSGS, chat_template_kwargs={"messages": []})
    finally:
        m.close()


@engine
def test_cache_types_as_ggml_ids(tiny, qwen35_gguf):
    from bonsai_runner import Llama

    def kv_bytes(m):
        return m._ctx.memory_report()["kv_bytes"]

    by_id = Llama(qwen35_gguf, n_ctx=128, verbose=False, type_k=8, type_v=8)
    by_name = Llama(qwen35_gguf, n_ctx=128, verbose=False, type_k="Q8_0", type_v="q8_0")
    f16 = Llama(qwen35_gguf, n_ctx=128, verbose=False, type_k=1, type_v=1)
    try:
        assert kv_bytes(by_id) == kv_bytes(by_name) < kv_bytes(f16)
        assert _greedy(by_id) == _greedy(by_name)
    finally:
        for m in (by_id, by_name, f16):
            m.close()
    with pytest.raises(ValueError, match="K = q8_0 needs a head size that is a multiple of 32"):
        Llama(tiny, type_k=8)  # the tiny llama's heads are 16 wide: 8 is q8_0
    with pytest.raises(ValueError, match=r"type_k=2 .*1 \(F16\) or 8 \(Q8_0\)"):
        Llama(tiny, type_k=2)
    with pytest.raises(ValueError, match="type_v='q4_0'"):
        Llama(tiny, type_v="q4_0")


@engine
def test_chat_formats(tiny):
    from bonsai_runner import Llama
    from bonsai_runner.chat_formats import CHAT_FORMATS

    markers = {"chatml": "<|im_start|>user\nHello there<|im_end|>", "llama-2": "[INST] <<SYS>>\nBe brief.",
               "llama-3": "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>",
               "mistral-instruct": "[INST] Be brief.\n\nHello there [/INST]",
               "gemma": "<start_of_turn>user\nBe brief.\n\nHello there<end_of_turn>\n<start_of_turn>model\n",
               "qwen": "<|im_start|>system\nBe brief.<|im_end|>", "vicuna": "Be brief. USER: Hello there ASSISTANT:",
               "alpaca": "### Instruction:\nHello there\n\n### Response:\n", "zephyr": "<|user|>\nHello there"}
    assert set(markers) == set(CHAT_FORMATS)
    for name, marker in markers.items():
        m = Llama(tiny, n_ctx=256, verbose=False, chat_format=name)
        try:
            assert m.chat_format == name
            assert marker in m._chat.render(MSGS, add_generation_prompt=True)
            r = m.create_chat_completion(MSGS, max_tokens=4, temperature=0)
            assert r["choices"][0]["message"]["role"] == "assistant"
        finally:
            m.close()
    with pytest.raises(ValueError, match=r"unknown chat_format='llama-9'.*chatml.*llama-3"):
        Llama(tiny, chat_format="llama-9")


@engine
def test_token_ids_and_perf_report(tiny, llm, capfd):
    from bonsai_runner import Llama

    nl = llm.token_nl()
    assert llm.tokenize(b"\n", add_bos=False) == [nl] and llm.detokenize([nl]) == b"\n"
    assert llm.token_bos() == 0 and llm.token_eos() == 2
    for no_perf in (False, True):
        m = Llama(tiny, n_ctx=256, verbose=True, no_perf=no_perf)
        try:
            capfd.readouterr()
            m("Hello", max_tokens=2)
            assert ("tokens/s" in capfd.readouterr().err) is not no_perf
        finally:
            m.close()


@engine
def test_logits_processor_and_stopping_criteria(llm):
    prompt = llm.tokenize(b"Hello world", add_bos=False)
    greedy = llm("Hello world", max_tokens=12, temperature=0, logprobs=0)
    banned = llm.tokenize(greedy["choices"][0]["logprobs"]["tokens"][0].encode(), add_bos=False)[-1]
    seen = []

    def ban(input_ids, scores):
        seen.append(len(input_ids))
        scores[banned] = -np.inf
        return scores

    a = llm("Hello world", max_tokens=12, temperature=0, logits_processor=ban)["choices"][0]["text"]
    b = llm("Hello world", max_tokens=12, temperature=0, logit_bias={banned: -100})["choices"][0]["text"]
    assert a == b != greedy["choices"][0]["text"]
    assert seen[0] == len(prompt) and seen[:3] == [len(prompt), len(prompt) + 1, len(prompt) + 2]
    r = llm.create_chat_completion(MSGS, max_tokens=6, temperature=0, logits_processor=[ban])
    assert r["choices"][0]["message"]["content"] == llm.create_chat_completion(
        MSGS, max_tokens=6, temperature=0, logit_bias={banned: -100})["choices"][0]["message"]["content"]

    def after_three(input_ids, scores):
        return len(input_ids) >= len(prompt) + 3

    r = llm("Hello world", max_tokens=12, temperature=0, stopping_criteria=after_three)
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 3
    gen = llm.generate(prompt, temp=0, stopping_criteria=[after_three])
    assert len(list(gen)) == 3
    with pytest.raises(ValueError, match="logits_processor must be a callable"):
        llm("Hi", logits_processor=5)
    with pytest.raises(ValueError, match="must return the"):
        llm("Hi", max_tokens=2, logits_processor=lambda ids, scores: scores[:5])


@engine
def test_sample_and_set_seed(tiny, llm):
    from bonsai_runner import Llama

    toks = llm.tokenize(b"Hello world", add_bos=False)
    llm.reset()
    llm.eval(toks)
    first = llm(toks, max_tokens=1, temperature=0, logprobs=0)["choices"][0]["logprobs"]["tokens"][0]
    llm.reset()
    llm.eval(toks)
    t = llm.sample(temp=0)
    assert llm.detokenize([t]).decode(errors="replace") == first
    assert llm.sample(temp=0, logit_bias={t: -100}) != t
    with pytest.raises(ValueError, match="logits_all=True"):
        llm.sample(idx=0)

    def draws(seed):
        m = Llama(tiny, n_ctx=64, verbose=False, seed=seed, logits_all=True)
        try:
            m.eval(toks)
            out = [m.sample(temp=1.5, top_k=0, top_p=1.0, min_p=0.0) for _ in range(12)]
            out.append(m.sample(temp=0, idx=0))
            m.set_seed(seed)
            assert [m.sample(temp=1.5, top_k=0, top_p=1.0, min_p=0.0) for _ in range(12)] == out[:12]
            return out
        finally:
            m.close()

    a, b = draws(7), draws(7)
    assert a == b and len(set(a[:12])) > 1 and a != draws(8)


# ---- save_state / load_state ----------------------------------------------------------------

def _continue(llm, n):
    """n greedy tokens after the evaluated ones, one eval at a time (logits_all keeps every row)."""
    out = []
    for _ in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    return out


def _check_state_roundtrip(llm, prompt, other):
    llm.reset()
    llm.eval(prompt)
    first = _continue(llm, 5)
    state = llm.save_state()
    assert state.n_tokens == len(prompt) + 5 and state.llama_state_size > 0
    want = _continue(llm, 8)
    llm.reset()
    llm.eval(other)
    _continue(llm, 3)
    llm.load_state(state)
    assert llm.n_tokens == state.n_tokens and llm.input_ids[: llm.n_tokens].tolist() == prompt + first
    assert _continue(llm, 8) == want
    # a second load of the same state, and generate() continuing from it, give the same tokens
    llm.load_state(state)
    gen = llm.generate([want[0]], temp=0, reset=False)
    got = [want[0]] + [next(gen) for _ in range(7)]
    gen.close()
    assert got == want
    return state


@engine
def test_save_and_load_state_llama(tiny, tmp_path):
    from bonsai_runner import Llama

    llm = Llama(tiny, n_ctx=128, verbose=False, logits_all=True)
    try:
        prompt = llm.tokenize(b"The answer is 42. Hello", add_bos=False)
        other = llm.tokenize(b"def add(a, b):", add_bos=False)
        state = _check_state_roundtrip(llm, prompt, other)
        # the state of another model, or one with too many tokens: refused
        small = Llama(tiny, n_ctx=8, verbose=False, logits_all=True)
        try:
            with pytest.raises(ValueError, match="larger n_ctx"):
                small.load_state(state)
        finally:
            small.close()
        other_path = tmp_path / "other.gguf"
        write_tiny_gguf(other_path, seed=1)
        foreign = Llama(str(other_path), n_ctx=128, verbose=False, logits_all=True)
        try:
            with pytest.raises(ValueError, match="different model file"):
                foreign.load_state(state)
        finally:
            foreign.close()
        with pytest.raises(ValueError, match="LlamaState"):
            llm.load_state(b"not a state")
    finally:
        llm.close()


@pytest.fixture(scope="module")
def qwen35_gguf(tmp_path_factory):
    pytest.importorskip("torch")
    from qwen35_factory import make_qwen35_model
    from test_convert import run_convert

    d = tmp_path_factory.mktemp("dropin_qwen35")
    make_qwen35_model(d / "hf", seed=2)
    return str(run_convert(d / "hf", d / "m.gguf", "f32"))


@engine
def test_save_and_load_state_qwen35(qwen35_gguf):
    from bonsai_runner import Llama

    llm = Llama(qwen35_gguf, n_ctx=128, verbose=False, logits_all=True, act_mode="float")
    try:
        assert llm._ctx.recurrent
        prompt = llm.tokenize(b"hello world hello", add_bos=False)
        other = llm.tokenize(b"import numpy as np", add_bos=False)
        state = _check_state_roundtrip(llm, prompt, other)
        q8 = Llama(qwen35_gguf, n_ctx=128, verbose=False, logits_all=True, act_mode="float", type_k=8)
        try:  # another KV cache type: another layout
            with pytest.raises(ValueError, match="different model or cache layout.*type_k=1 .*type_k=8 "):
                q8.load_state(state)
        finally:
            q8.close()
        # a completion after load_state equals one from a fresh Llama on the same tokens
        llm.reset()
        llm.eval(prompt)
        state = llm.save_state()
        llm.reset()
        llm.eval(other)
        llm.load_state(state)
        after = llm(prompt + [int(np.argmax(llm.scores[llm.n_tokens - 1]))], max_tokens=6, temperature=0)
        fresh = Llama(qwen35_gguf, n_ctx=128, verbose=False, logits_all=True, act_mode="float")
        try:
            cold = fresh(prompt + [int(np.argmax(llm.scores[len(prompt) - 1]))], max_tokens=6, temperature=0)
        finally:
            fresh.close()
        assert after["choices"][0]["text"] == cold["choices"][0]["text"]
    finally:
        llm.close()


# ---- from_pretrained --------------------------------------------------------------------------

@engine
def test_from_pretrained_offline_cache(tiny, llm, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants
    from bonsai_runner import Llama

    cache = tmp_path / "hub"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = cache / "models--someone--tiny-bonsai" / "snapshots" / rev
    snap.mkdir(parents=True)
    shutil.copy(tiny, snap / "tiny-q8_0.gguf")
    (snap / "README.md").write_text("a tiny model")
    (cache / "models--someone--tiny-bonsai" / "refs").mkdir()
    (cache / "models--someone--tiny-bonsai" / "refs" / "main").write_text(rev)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read at import; the env var is for subprocesses

    for filename in ("tiny-q8_0.gguf", "*q8_0.gguf"):
        m = Llama.from_pretrained("someone/tiny-bonsai", filename, cache_dir=str(cache), n_ctx=256, verbose=False)
        try:
            assert os.path.samefile(m.model_path, snap / "tiny-q8_0.gguf")
            assert _greedy(m) == _greedy(llm)
        finally:
            m.close()
    with pytest.raises(ValueError, match=r"no file of someone/tiny-bonsai matches '\*.bin'"):
        Llama.from_pretrained("someone/tiny-bonsai", "*.bin", cache_dir=str(cache))
    with pytest.raises(ValueError, match="matches 2 files"):
        Llama.from_pretrained("someone/tiny-bonsai", "*", cache_dir=str(cache))
    with pytest.raises(ValueError, match="not in the cache"):
        Llama.from_pretrained("someone/absent", "*.gguf", cache_dir=str(cache))
    with pytest.raises(ValueError, match="could not get 'missing.gguf'"):
        Llama.from_pretrained("someone/tiny-bonsai", "missing.gguf", cache_dir=str(cache))
    with pytest.raises(ValueError, match="additional_files"):
        Llama.from_pretrained("someone/tiny-bonsai", "*.gguf", cache_dir=str(cache), additional_files=["b.gguf"])
    with pytest.raises(TypeError, match="did you mean 'n_ctx'"):  # the other keywords go to Llama()
        Llama.from_pretrained("someone/tiny-bonsai", "*.gguf", cache_dir=str(cache), n_ctxx=64)
    local = tmp_path / "local"  # offline, local_dir must already hold the file
    with pytest.raises(ValueError, match="could not get 'tiny-q8_0.gguf'"):
        Llama.from_pretrained("someone/tiny-bonsai", "*.gguf", local_dir=str(local), cache_dir=str(cache))
    local.mkdir(exist_ok=True)  # huggingface_hub may have created it
    shutil.copy(tiny, local / "tiny-q8_0.gguf")
    m = Llama.from_pretrained("someone/tiny-bonsai", "*.gguf", local_dir=str(local), cache_dir=str(cache),
                              n_ctx=64, verbose=False)
    try:
        assert os.path.samefile(m.model_path, local / "tiny-q8_0.gguf")
    finally:
        m.close()


def test_from_pretrained_without_huggingface_hub(monkeypatch):
    import builtins

    from bonsai_runner import Llama

    real_import = builtins.__import__

    def no_hub(name, *args, **kwargs):
        if name == "huggingface_hub" or name.startswith("huggingface_hub."):
            raise ImportError("No module named 'huggingface_hub'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        Llama.from_pretrained("someone/tiny-bonsai", "*.gguf")
