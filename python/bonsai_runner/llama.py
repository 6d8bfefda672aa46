"""`Llama`: the high-level Python API over the native engine, modelled on llama-cpp-python's `Llama`.

One `Llama` owns one `_core.Model` and one single-sequence `_core.Context`. It mirrors the
evaluated tokens in `input_ids[:n_tokens]` (sequence 0 of the KV cache holds exactly these); with
`logits_all=True` every evaluated position's logits are kept in `scores[:n_tokens]` (needed for
echoed prompt logprobs), otherwise only the newest row is kept. Each generation starts by keeping the KV cache of the longest common prefix of the new
prompt and the evaluated tokens (at least one prompt token is always re-evaluated so there are fresh
logits to sample from) and removing the rest, so chat turns and repeated prompts skip most prefill.

Generation is lazy: a sampled token is evaluated only when the next token is wanted, so a call
that stops on max_tokens leaves its last token unevaluated, as llama-cpp-python does. Text goes
through `TextStream`, which keeps partial UTF-8 characters and possible stop-string prefixes out of
streamed chunks; streamed and non-streamed calls share this path, so their text is identical.

Threads: one call at a time per `Llama`, enforced (see use_guard.py). The engine's `decode`
releases the GIL, and two threads decoding into the one KV cache would return wrong text without
an error, so every public call holds the Llama's `UseGuard` for its whole duration: a second thread
waits and then gets exactly the answer it would have got alone. A stream (`stream=True`,
`generate`) holds it from its first `next()` until it is exhausted, closed or garbage-collected;
a thread waiting only on a stream that its owner stopped reading gives up after `stream_wait_s`
seconds (constructor argument, default 30) with a BonsaiError rather than deadlocking. The thread
that holds a stream may still call the Llama itself: that call runs, and the suspended stream then
raises "interrupted" on its next step. Sequential use from several threads just works; for
parallel requests use one Llama per thread or `bonsai serve` (parallel sequences).

llama-cpp-python compatibility (llama_compat.py): its keywords are all accepted; those with no
effect here warn once, those that would change results are refused; a misspelled keyword is a
TypeError that suggests the right one. save_state / load_state copy the sequence's engine state
(KV rows, recurrent state) with the tokens and logits, so a continuation after load_state is the one
that would have followed the save.

Embeddings (`embedding=True`): `embed` / `create_embedding` run each input on sequence 1 of the
context, which holds nothing else and is emptied after every input, so the generation cache of
sequence 0 is never touched; only when an input needs more KV cells than sequence 0 leaves free is
that cache dropped first (the next generation evaluates its prompt again: same output, more
prefill). Pooling and normalization are llama.cpp's (see embeddings.py).

Constrained output (constrained.py): create_completion(grammar=...) and create_chat_completion
(response_format=..., grammar=...) mask every sampled token to the grammar (a GBNF string, or an
object holding one in `_grammar` / `grammar`, as llama-cpp-python's LlamaGrammar) or JSON schema
(response_format json_object / json_schema); generation stops with finish_reason "stop" once the
grammar admits no further token. The token table is built on the first constrained call.

Every integer and float parameter is checked against the engine's ranges (engine_limits.py: C int
counts up to 2**31-1, seeds up to 2**64-1, finite float32 values) before it reaches the binding, so
bad values are one BonsaiError naming the parameter and its range.
"""

from __future__ import annotations

import inspect
import os
import random
import sys
import time
import warnings
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from . import completion_format as fmt
from . import embeddings as emb
from .chat_formats import chat_format as builtin_chat_format
from .chat_template import ChatTemplate
from .constrained import LazyVocabulary, request_constraint
from .engine_limits import INT32_MAX, UINT64_MAX, check_float, check_int
from .errors import BonsaiError, check_model_file
from .llama_compat import (INIT_KEYWORDS, SAMPLING_KEYWORDS, LlamaState, cache_type_name, check_compat_keywords,
                           check_rope, hub_download, model_identity, reject_unknown_keywords)
from .sampling_params import check_penalty, normalize_logit_bias
from .text_stream import TextStream, normalize_stop
from .tool_calls import ChunkFilter, apply_to_response, plan_tools
from .use_guard import DEFAULT_STREAM_WAIT_S, GuardedStream, UseGuard
from .vocab_facts import adds_bos, common_prefix_len, end_of_generation_ids, special_token_id, token_text

try:
    from . import _core
except ImportError:  # the package without its native module: Llama() explains how to build it
    _core = None

__all__ = ["Llama", "LlamaState", "LLAMA_DEFAULT_SEED"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # "pick a random seed", as in llama.cpp
ACT_MODES = ("int8", "float")
FLT_MAX = float(np.finfo(np.float32).max)  # the sampler's parameters are C floats
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BonsaiError(f"{what} is not valid Unicode text (a lone surrogate {text[e.start]!r} at "
                          f"character {e.start}); pass well-formed text or UTF-8 bytes") from None


class Llama:
    """A model and its context. See the module docstring for the caching behaviour."""

    def __init__(self, model_path: Union[str, os.PathLike], *, n_gpu_layers: int = 0,
                 use_mmap: bool = True, seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: Optional[int] = None, n_threads_batch: Optional[int] = None,
                 pooling_type: Union[None, int, str] = -1, rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0,
                 logits_all: bool = False, embedding: bool = False, flash_attn: bool = False,
                 no_perf: bool = False, last_n_tokens_size: int = 64, chat_format: Optional[str] = None,
                 tokenizer: Optional[str] = None, type_k: Union[str, int, None] = None,
                 type_v: Union[str, int, None] = None, spm_infill: bool = False, verbose: bool = True,
                 cuda_graph: bool = True, chat_template: Optional[str] = None, act_mode: str = "int8",
                 stream_wait_s: float = DEFAULT_STREAM_WAIT_S, huge_pages: bool = True, repack: bool = True,
                 **kwargs):
        """Loads `model_path`. Takes llama-cpp-python's keywords: see the README's "Llama API" for
        which are honoured, which warn (no effect here) and which are refused (would change results)."""
        self._model = None
        self._ctx = None
        self._guard = UseGuard(check_float("stream_wait_s", stream_wait_s, 0.0, 1e9))
        reject_unknown_keywords([k for k in kwargs if k not in INIT_KEYWORDS],
                                _parameter_names(Llama.__init__) + list(INIT_KEYWORDS), "Llama")
        check_compat_keywords(INIT_KEYWORDS, kwargs, "Llama")
        if _core is None or not hasattr(_core, "Model"):
            raise BonsaiError("the native engine (bonsai_runner._core) is not built: "
                              "run `pip install .` or scripts/dev_build.sh")
        if not isinstance(model_path, (str, bytes, os.PathLike)):
            raise BonsaiError(f"model_path must be a path (str or os.PathLike), "
                              f"not {type(model_path).__name__}")
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            raise BonsaiError(f"tokenizer must be the path of a tokenizer.model file; llama-cpp-python's "
                              f"tokenizer objects ({type(tokenizer).__name__}) are not supported")
        path = os.fsdecode(os.fspath(model_path))
        check_model_file(path)
        n_ctx = check_int("n_ctx", n_ctx, 0, INT32_MAX)
        n_batch = check_int("n_batch", n_batch, 1, INT32_MAX)
        n_threads = 0 if n_threads is None else check_int("n_threads", n_threads, 0, INT32_MAX)
        if n_threads_batch is not None and check_int("n_threads_batch", n_threads_batch, 0, INT32_MAX) != n_threads:
            warnings.warn(f"Llama: n_threads_batch={n_threads_batch} has no effect here: bonsai uses one "
                          f"thread pool (n_threads) for prompts and generation", UserWarning, stacklevel=2)
        n_gpu_layers = check_int("n_gpu_layers", n_gpu_layers, -1, INT32_MAX)
        seed = check_int("seed", seed, -1, UINT64_MAX)
        if seed < 0:
            seed = LLAMA_DEFAULT_SEED
        type_k, type_v = cache_type_name("type_k", type_k), cache_type_name("type_v", type_v)
        if act_mode not in ACT_MODES:
            raise BonsaiError(f"unknown act_mode={act_mode!r}; use one of {', '.join(ACT_MODES)} "
                              "(int8: per-token INT8 activations, float: full-precision activations)")
        self._last_n_tokens_size = check_int("last_n_tokens_size", last_n_tokens_size, -1, INT32_MAX)
        self._spm_infill = bool(spm_infill)
        self._no_perf = bool(no_perf)
        fmt_spec = builtin_chat_format(chat_format) if chat_format is not None else None
        if fmt_spec is not None and chat_template is not None:
            raise BonsaiError("give chat_format= or chat_template=, not both")
        self.chat_format = chat_format
        self.chat_handler = None
        self.lora_path = None
        self.last_n_tokens_size = self._last_n_tokens_size

        self.model_path = path
        self._tokenizer_override = tokenizer is not None
        self.verbose = bool(verbose)
        self._logits_all = bool(logits_all)
        self._seed = seed
        self._sample_seeds = random.Random(None if seed == LLAMA_DEFAULT_SEED else seed)  # for sample()
        self._embedding = bool(embedding)
        if not self._embedding and pooling_type not in (None, -1):
            raise BonsaiError("pooling_type applies to embeddings: create the Llama with embedding=True as well")
        self._model = _core.Model(path, use_mmap=bool(use_mmap), n_gpu_layers=n_gpu_layers,
                                  tokenizer=None if tokenizer is None else os.fspath(tokenizer), verbose=self.verbose,
                                  huge_pages=bool(huge_pages), repack=bool(repack))
        try:
            check_rope(self._model, rope_freq_base, rope_freq_scale)
        except BaseException:
            self.close()
            raise
        if n_ctx == 0:
            n_ctx = int(self._model.n_ctx_train)
        try:
            # embeddings: the file's pooling unless overridden (llama.cpp: none without the key)
            self.pooling = emb.resolve_pooling(pooling_type, lambda: self._model.pooling_type, BonsaiError) \
                if self._embedding else None
            self._ctx = _core.Context(self._model, n_ctx=n_ctx, n_batch=min(n_batch, n_ctx),
                                      n_seq_max=2 if self._embedding else 1,
                                      n_threads=n_threads, type_k=type_k, type_v=type_v,
                                      act_mode=act_mode, flash_attn=bool(flash_attn),
                                      cuda_graph=bool(cuda_graph))
        except BaseException:
            self.close()
            raise
        self.n_batch = min(n_batch, n_ctx)
        self._n_ctx = int(self._ctx.n_ctx)
        self._n_vocab = int(self._model.n_vocab)
        self.metadata = dict(self._model.metadata)
        self.n_tokens = 0
        self.input_ids = np.zeros(self._n_ctx, dtype=np.intc)
        # Every position's logits with logits_all (as llama-cpp-python: n_ctx rows); otherwise only
        # the newest row is kept, in _last_logits, and scores is not filled.
        self.scores = np.zeros((self._n_ctx if self._logits_all else self.n_batch, self._n_vocab),
                               dtype=np.single)
        self._last_logits = np.zeros(self._n_vocab, dtype=np.single)
        self._n_reused = 0
        self._generation = 0  # bumped by every call that changes the cache; see generate()
        self._pieces: dict[int, bytes] = {}
        self._eog = self._end_of_generation_ids()
        self._constraint_vocab = LazyVocabulary(self._model, self._n_vocab, sorted(self._eog))
        bos = self.token_bos()
        self._add_bos = adds_bos(self._model)
        eos_text = self._token_text(self.token_eos())
        if fmt_spec is not None:
            self._chat = ChatTemplate(fmt_spec.template, bos_token=self._token_text(bos), eos_token=eos_text)
            self._chat_stops = list(fmt_spec.stop)
        elif chat_template:
            self._chat = ChatTemplate(chat_template, bos_token=self._token_text(bos), eos_token=eos_text)
            self._chat_stops = []
        else:
            self._chat = ChatTemplate.from_metadata(self.metadata, bos_token=self._token_text(bos), eos_token=eos_text)
            self._chat_stops = []
        self._model_id = model_identity(path, self.metadata)

    # ---- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the context and the model; the object is unusable afterwards. Safe to repeat.
        Waits for a call in progress in another thread (see the module docstring)."""
        with self._guard.call():
            ctx, model = self._ctx, self._model
            self._ctx = self._model = None
            if ctx is not None:
                ctx.close()
            if model is not None:
                model.close()

    def __enter__(self) -> "Llama":
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_guard", None) is None:
            return  # the constructor failed before anything was allocated
        try:
            self.close()
        except Exception:
            pass

    def _live(self):
        if getattr(self, "_ctx", None) is None:
            raise BonsaiError("this Llama has been closed; create a new one")
        return self._ctx

    # ---- model facts ------------------------------------------------------------------------

    def n_ctx(self) -> int:
        return self._n_ctx

    def n_vocab(self) -> int:
        return self._n_vocab

    def n_embd(self) -> int:
        n = getattr(self._model, "n_embd", None)
        return int(n if n is not None else self.metadata.get(f"{self._model.arch}.embedding_length", 0))

    def token_bos(self) -> int:
        return int(self._model.bos)

    def token_eos(self) -> int:
        return int(self._model.eos)

    def token_nl(self) -> int:
        """The id of the newline token ("\\n" tokenized alone, as llama.cpp's llama_token_nl)."""
        with self._guard.call():
            self._live()
            ids = self._tokenize(b"\n", False, False)
        if len(ids) != 1:
            raise BonsaiError(f"this vocabulary has no single newline token ('\\n' tokenizes to {ids})")
        return int(ids[0])

    # ---- state ------------------------------------------------------------------------------

    def save_state(self) -> LlamaState:
        """A snapshot of the evaluated tokens, their logits and the engine's state of them (KV
        cache rows, and the recurrent state of qwen35 models): after load_state of it, generation
        continues exactly as it would have from here."""
        with self._guard.call():
            ctx = self._live()
            kept = self.scores[: self.n_tokens].copy() if self._logits_all else self._last_logits[None, :].copy()
            return LlamaState(input_ids=self.input_ids[: self.n_tokens].copy(), scores=kept,
                              last_logits=self._last_logits.copy(), n_tokens=int(self.n_tokens),
                              seq_state=ctx.save_seq_state(0), model_id=self._model_id,
                              logits_all=self._logits_all)

    def load_state(self, state: LlamaState) -> None:
        """Restores a save_state snapshot of this model (a ValueError for another model, another KV
        cache type or a context too small for it)."""
        if not isinstance(state, LlamaState):
            raise BonsaiError(f"load_state expects a LlamaState from save_state(), not {type(state).__name__}")
        with self._guard.call():
            ctx = self._live()
            if state.model_id != self._model_id:
                raise BonsaiError("load_state: the state was saved from a different model file; load it into a "
                                  "Llama of the same model")
            if state.n_tokens > self._n_ctx:
                raise BonsaiError(f"load_state: the state holds {state.n_tokens} tokens, more than this context's "
                                  f"n_ctx={self._n_ctx}; create the Llama with a larger n_ctx")
            if self._logits_all and not state.logits_all and state.n_tokens > 0:
                raise BonsaiError("load_state: the state was saved without logits_all, so it lacks the logits of "
                                  "every position that this Llama (logits_all=True) keeps")
            ctx.load_seq_state(0, state.seq_state)
            self._generation += 1
            self.n_tokens = state.n_tokens
            self.input_ids[: state.n_tokens] = state.input_ids
            if self._logits_all:
                self.scores[: state.n_tokens] = state.scores
            self._last_logits = state.last_logits.copy()

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: Optional[str], local_dir: Optional[str] = None,
                        cache_dir: Optional[str] = None, *, revision: Optional[str] = None,
                        additional_files: Optional[list] = None, local_dir_use_symlinks: Any = "auto",
                        **kwargs) -> "Llama":
        """Downloads `filename` (a name or a glob pattern matching one file, e.g. "*q4_0.gguf") of the
        Hugging Face repository `repo_id` through huggingface_hub (cached; HF_HUB_OFFLINE=1 uses the
        cache only) and loads it with the other keywords. llama-cpp-python's additional_files (the
        other parts of a split GGUF) are refused: the engine reads single-file models only."""
        if filename is None:
            raise BonsaiError("from_pretrained needs filename=: the GGUF file (or a glob pattern) in the repository")
        if additional_files:
            raise BonsaiError("from_pretrained: additional_files (split GGUF parts) is not supported: the engine "
                              "reads single-file models; merge the parts with llama-gguf-split --merge")
        if local_dir_use_symlinks != "auto":
            warnings.warn(f"from_pretrained: local_dir_use_symlinks={local_dir_use_symlinks!r} has no effect here: "
                          "huggingface_hub decides how local_dir is filled", UserWarning, stacklevel=2)
        return cls(hub_download(repo_id, filename, local_dir=local_dir, cache_dir=cache_dir, revision=revision),
                   **kwargs)

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[: self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[: self.n_tokens, :]

    def _end_of_generation_ids(self) -> frozenset:
        return end_of_generation_ids(_core, self._model, self.metadata, self._n_vocab, self._tokenizer_override)

    def _token_text(self, token: int) -> str:
        """The written form of a (special) token, as chat templates expect for bos/eos_token."""
        return token_text(self.metadata, token, self._piece)

    def _piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = bytes(self._model.token_to_piece(int(token)))
        return p

    # ---- tokens -----------------------------------------------------------------------------

    def tokenize(self, text: Union[bytes, str], add_bos: bool = True, special: bool = False) -> list[int]:
        """Tokenizes UTF-8 `text`. `add_bos` adds the model's BOS when its vocabulary asks for one;
        `special` parses special-token text such as "<|im_start|>" into their ids."""
        if isinstance(text, str):
            text = _utf8(text, "the text to tokenize")
        if not isinstance(text, (bytes, bytearray)):
            raise BonsaiError(f"tokenize expects bytes (UTF-8 text), not {type(text).__name__}")
        with self._guard.call():
            self._live()
            return self._tokenize(bytes(text), add_bos, special)

    def _tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        return list(self._model.tokenize(text, add_special=bool(add_bos), parse_special=bool(special)))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """The bytes of `tokens` (prev_tokens/special are accepted for llama-cpp-python compatibility)."""
        with self._guard.call():
            self._live()
            return bytes(self._model.detokenize(self._check_tokens(tokens, allow_empty=True)))

    def _check_tokens(self, tokens: Any, allow_empty: bool = False) -> list[int]:
        if isinstance(tokens, np.ndarray):
            tokens = tokens.tolist()
        if not isinstance(tokens, (list, tuple)):
            raise BonsaiError(f"tokens must be a list of token ids, not {type(tokens).__name__}")
        if not tokens and not allow_empty:
            raise BonsaiError("the token list is empty")
        out = []
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < self._n_vocab:
                raise BonsaiError(f"invalid token id {t!r}: ids must be integers in [0, {self._n_vocab})")
            out.append(int(t))
        return out

    # ---- evaluation -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets the evaluated tokens (and so the cached prefix)."""
        with self._guard.call():
            self._live().clear()
            self._generation += 1
            self.n_tokens = 0

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluates `tokens` after the first `n_tokens` ones, in batches of n_batch."""
        with self._guard.call():
            self._generation += 1
            self._eval(tokens)

    def _eval(self, tokens: Sequence[int]) -> None:
        ctx = self._live()
        tokens = self._check_tokens(tokens, allow_empty=True)
        if self.n_tokens + len(tokens) > self._n_ctx:
            raise BonsaiError(f"context full: {self.n_tokens} evaluated + {len(tokens)} new tokens exceed "
                              f"n_ctx={self._n_ctx}; create the Llama with a larger n_ctx")
        ctx.seq_rm(0, self.n_tokens, -1)
        want = "all" if self._logits_all else "last"
        for i in range(0, len(tokens), self.n_batch):
            batch = tokens[i: i + self.n_batch]
            p0, n = self.n_tokens, len(batch)
            logits = ctx.decode(batch, pos=list(range(p0, p0 + n)), logits=want)
            self.input_ids[p0: p0 + n] = batch
            if self._logits_all:
                self.scores[p0: p0 + n, :] = logits
            self._last_logits = logits[-1]  # decode returns a fresh array: no copy needed
            self.n_tokens += n

    def _reuse_prefix(self, tokens: list[int]) -> int:
        """Keeps the KV cache of the longest common prefix with the evaluated tokens, leaving at
        least one token of `tokens` to evaluate; returns how many tokens were kept. A recurrent
        model (qwen35) keeps only what its state can resume from exactly (Context.seq_reusable)."""
        keep = min(common_prefix_len(self._input_ids.tolist(), tokens), len(tokens) - 1)
        self.n_tokens = self._n_reused = self._live().seq_reusable(0, max(keep, 0))
        self._live().seq_rm(0, self.n_tokens, -1)
        return self.n_tokens

    def _sampling_seed(self, seed: Optional[int]) -> int:
        if seed is not None:  # any uint64 is accepted; sampling uses its low 32 bits, as llama.cpp
            return check_int("seed", seed, 0, UINT64_MAX) & 0xFFFFFFFF
        if self._seed == LLAMA_DEFAULT_SEED:
            return random.SystemRandom().randrange(0, 0xFFFFFFFF)
        return random.Random(self._seed).randrange(0, 0xFFFFFFFF)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor=None, stopping_criteria=None, grammar=None,
                 *, seed: Optional[int] = None, repeat_last_n: Optional[int] = None,
                 logit_bias: Optional[dict] = None, **kwargs) -> Iterator[int]:
        """Yields sampled tokens after `tokens` forever (the caller stops). With `reset`, the cached
        prefix is reused; without it, `tokens` are evaluated after the current `n_tokens`. The
        arguments are checked now; the iterator holds the Llama while it runs (module docstring).
        repeat_last_n defaults to the constructor's last_n_tokens_size."""
        self._check_call_keywords("generate", kwargs, typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                                  mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, penalize_nl=penalize_nl,
                                  grammar=grammar)
        processor = _callables("logits_processor", logits_processor)
        stopper = _callables("stopping_criteria", stopping_criteria)
        with self._guard.call():
            self._live()
            tokens = self._check_tokens(tokens)
            args = self._sampler_args(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                                      frequency_penalty, presence_penalty, logit_bias)
            sampler = self._make_sampler(args)
        return GuardedStream(self._guard, lambda: self._generate(tokens, sampler, args["repeat_last_n"], reset,
                                                                 processor, stopper))

    def _check_call_keywords(self, where: str, unknown: dict, **compat) -> None:
        """Unknown keywords of a call are a TypeError with a suggestion; llama-cpp-python's sampling
        keywords we do not implement follow SAMPLING_KEYWORDS' policy."""
        known = _parameter_names(getattr(Llama, where)) + list(SAMPLING_KEYWORDS)
        reject_unknown_keywords(unknown, known, where)
        check_compat_keywords(SAMPLING_KEYWORDS, compat, where, stacklevel=4)

    def _generate(self, tokens: list[int], sampler, repeat_last_n: int, reset: bool,
                  processor=None, stopper=None) -> Iterator[int]:
        """`generate` without the guard (the caller holds it); arguments already checked.
        `processor` (logits_processor) rewrites each logits row before the sampler sees it; the
        iterator ends, before yielding the token just sampled, when `stopper` (stopping_criteria)
        says so, as llama-cpp-python's generate does; it is endless otherwise."""
        self._generation += 1
        mine = self._generation
        if reset:
            tokens = tokens[self._reuse_prefix(tokens):]
        if repeat_last_n != 0:  # -1: the whole history
            history = self._input_ids.tolist() + tokens
            for t in (history if repeat_last_n < 0 else history[-repeat_last_n:]):
                sampler.accept(int(t))
        self._eval(tokens)
        while True:
            token = int(sampler.sample(self._processed(processor, self._last_logits, self._input_ids)))
            if stopper is not None and self._stops(stopper):
                return
            sampler.accept(token)
            yield token
            if self._generation != mine:
                raise BonsaiError("this generation was interrupted: another call used the same Llama "
                                  "while it was suspended; finish or close a stream before the next call")
            self._eval([token])

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor=None, grammar=None,
               idx: Optional[int] = None, *, logit_bias: Optional[dict] = None, **kwargs) -> int:
        """One token sampled from the logits of evaluated position `idx` (None: the newest; others
        need logits_all=True), with the penalties over the last last_n_tokens_size tokens before it,
        as llama-cpp-python's sample(). Successive calls draw from the constructor's seed stream."""
        self._check_call_keywords("sample", kwargs, typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                                  mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, penalize_nl=penalize_nl,
                                  grammar=grammar)
        processor = _callables("logits_processor", logits_processor)
        with self._guard.call():
            self._live()
            if self.n_tokens == 0:
                raise BonsaiError("sample: nothing has been evaluated yet; eval() some tokens first")
            pos = self.n_tokens - 1 if idx is None else check_int("idx", idx, 0, self.n_tokens - 1)
            if pos != self.n_tokens - 1 and not self._logits_all:
                raise BonsaiError(f"sample(idx={idx}) needs the logits of an earlier position: create the Llama "
                                  "with logits_all=True")
            args = self._sampler_args(temp, top_k, top_p, min_p, repeat_penalty, None, None, frequency_penalty,
                                      presence_penalty, logit_bias)
            args["seed"] = self._sample_seeds.randrange(0, 0xFFFFFFFF)
            sampler = self._make_sampler(args)
            n = args["repeat_last_n"]
            history = self.input_ids[: pos + 1].tolist()
            for t in (history if n < 0 else history[len(history) - n:] if n > 0 else []):
                sampler.accept(int(t))
            row = self._last_logits if pos == self.n_tokens - 1 else self.scores[pos]
            return int(sampler.sample(self._processed(processor, row, self.input_ids[: pos + 1])))

    def set_seed(self, seed: int) -> None:
        """The seed of later calls that pass none (as llama-cpp-python's set_seed)."""
        seed = check_int("seed", seed, -1, UINT64_MAX)
        self._seed = LLAMA_DEFAULT_SEED if seed < 0 else seed
        self._sample_seeds = random.Random(None if self._seed == LLAMA_DEFAULT_SEED else self._seed)

    def pooling_type(self) -> int:
        """llama.cpp's number of the pooling embeddings use (0 none, 1 mean, 2 cls, 3 last; its name is
        `self.pooling`); -1 without embedding=True, as llama.cpp's unspecified."""
        return emb.POOLING_TYPES[self.pooling] if self._embedding else -1

    def _processed(self, processor, row: np.ndarray, input_ids: np.ndarray) -> np.ndarray:
        """`row` through llama-cpp-python's logits_processor(input_ids, scores) if given."""
        if processor is None:
            return row
        out = row.copy()
        for f in processor:
            out = np.asarray(f(input_ids, out), dtype=np.single)
            if out.shape != (self._n_vocab,):
                raise BonsaiError(f"logits_processor returned an array of shape {out.shape}; it must return "
                                  f"the {self._n_vocab} logits it was given, modified")
        return out

    def _stops(self, stopper) -> bool:
        """Whether llama-cpp-python's stopping_criteria(input_ids, scores) ends the generation."""
        return any(bool(f(self._input_ids, self._last_logits)) for f in stopper)

    def _sampler_args(self, temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                      frequency_penalty=0.0, presence_penalty=0.0, logit_bias=None) -> dict:
        """The checked sampler parameters (BonsaiError naming the first bad one)."""
        if repeat_last_n is None:
            repeat_last_n = self._last_n_tokens_size
        return dict(
            temp=check_float("temperature", temp, 0.0, FLT_MAX, what="0 = greedy"),
            top_p=check_float("top_p", top_p, 0.0, 1.0, lo_open=True),
            min_p=check_float("min_p", min_p, 0.0, 1.0),
            top_k=check_int("top_k", top_k, 0, INT32_MAX),
            repeat_penalty=check_float("repeat_penalty", repeat_penalty, 0.0, FLT_MAX, lo_open=True,
                                       what="1 = off"),
            repeat_last_n=check_int("repeat_last_n", repeat_last_n, -1, INT32_MAX),
            frequency_penalty=check_penalty("frequency_penalty", frequency_penalty),
            presence_penalty=check_penalty("presence_penalty", presence_penalty),
            logit_bias=normalize_logit_bias(logit_bias, self._n_vocab),
            seed=None if seed is None else check_int("seed", seed, 0, UINT64_MAX))

    def _make_sampler(self, args: dict):
        return _core.Sampler(temp=args["temp"], top_k=args["top_k"], top_p=args["top_p"], min_p=args["min_p"],
                             repeat_penalty=args["repeat_penalty"], repeat_last_n=args["repeat_last_n"],
                             frequency_penalty=args["frequency_penalty"],
                             presence_penalty=args["presence_penalty"], logit_bias=args["logit_bias"],
                             seed=self._sampling_seed(args["seed"]))

    # ---- embeddings -------------------------------------------------------------------------

    def embed(self, input: Union[str, list[str], list[int], list[list[int]]], normalize: bool = True,
              truncate: bool = True, return_count: bool = False):
        """Embeddings of `input`, as llama-cpp-python: one list of floats (n_embd) per input, or
        per-token lists with pooling none; a string or one token list gives its embedding alone, a
        list of them a list. `normalize`: L2 (unit Euclidean norm, per token with pooling none).
        An input longer than n_ctx is cut to n_ctx tokens with `truncate`, else refused.
        `return_count` returns (embeddings, tokens embedded). Text is tokenized with the model's
        BOS when it asks for one, special-token text not parsed (as `tokenize`).

        Pooling (`self.pooling`): the constructor's `pooling_type`, else the file's
        `<arch>.pooling_type`, else none, as llama.cpp and llama-cpp-python do for a generative
        model without the key (llama-server's /v1/embeddings then refuses: `--pooling` there)."""
        with self._guard.call():
            vectors, n, single = self._embed(input, normalize, truncate)
        result = vectors[0] if single else vectors
        return (result, n) if return_count else result

    def create_embedding(self, input: Union[str, list[str], list[int], list[list[int]]],
                         model: Optional[str] = None) -> dict:
        """OpenAI's embeddings response: {"object": "list", "data": [{"object": "embedding",
        "embedding": [...], "index": i}, ...], "model", "usage"}, normalized vectors."""
        with self._guard.call():
            vectors, n, _ = self._embed(input, True, True)
        return emb.embedding_list(vectors, model if model is not None else self.model_path, n)

    def _embed(self, input, normalize: bool, truncate: bool) -> tuple[list, int, bool]:
        """(one embedding per input, tokens embedded, whether `input` was a single input)."""
        ctx = self._live()
        if not self._embedding:
            raise BonsaiError("Llama model must be created with embedding=True to call this method "
                              "(Llama(model_path, embedding=True))")
        inputs, single = emb.parse_input(input, lambda t: self._tokenize(_utf8(t, "the input"), True, False),
                                         self._n_vocab, BonsaiError)
        for i, tokens in enumerate(inputs):
            if len(tokens) > self._n_ctx:
                if not truncate:
                    raise BonsaiError(f"input {i} has {len(tokens)} tokens, more than n_ctx={self._n_ctx}; "
                                      "pass truncate=True to cut it, or create the Llama with a larger n_ctx")
                inputs[i] = tokens[: self._n_ctx]
        out = []
        for tokens in inputs:
            if len(tokens) > self._n_ctx - self.n_tokens:  # sequence 0's cache leaves too few cells
                ctx.seq_rm(0, -1, -1)
                self.n_tokens = 0
                self._generation += 1
            rows = ctx.embed(tokens, seq=1, pooling=self.pooling)
            if normalize:
                rows = emb.l2_normalize(rows)
            vectors = np.asarray(rows, dtype=np.float64).tolist()
            out.append(vectors if self.pooling == "none" else vectors[0])
        return out, sum(len(t) for t in inputs), single

    # ---- completion -------------------------------------------------------------------------

    def _prompt_tokens(self, prompt: Any, suffix: Optional[str]) -> tuple[list[int], bool]:
        """The prompt's tokens, and whether the suffix went into them (fill-in-the-middle)."""
        fim = self._fim_ids() if suffix is not None and isinstance(prompt, str) else None
        if isinstance(prompt, str):
            if prompt == "":
                raise BonsaiError("the prompt is empty; give some text or a list of token ids")
            toks = self._tokenize(_utf8(prompt, "the prompt"), fim is None, fim is None)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            if len(prompt) == 0:
                raise BonsaiError("the prompt is empty; give some text or a list of token ids")
            toks = self._check_tokens(prompt)
        else:
            raise BonsaiError(f"prompt must be a string or a list of token ids, not {type(prompt).__name__}")
        if fim is not None:
            pre, suf, mid = fim
            suffix_toks = self._tokenize(_utf8(suffix, "the suffix"), False, False) if suffix else []
            head = [self.token_bos()] if self._add_bos else []
            if self._spm_infill:  # suffix first (SPM order), as llama-cpp-python's spm_infill=True
                toks = head + [suf] + suffix_toks + [pre] + toks + [mid]
            else:
                toks = head + [pre] + toks + [suf] + suffix_toks + [mid]
        if len(toks) >= self._n_ctx:
            raise BonsaiError(f"the prompt has {len(toks)} tokens, which does not fit the context "
                              f"(n_ctx={self._n_ctx}); shorten it or create the Llama with a larger n_ctx")
        return toks, fim is not None

    def _fim_ids(self) -> Optional[tuple[int, int, int]]:
        ids = [self.metadata.get(f"tokenizer.ggml.fim_{k}_token_id") for k in ("pre", "suf", "mid")]
        if all(isinstance(i, (int, np.integer)) and 0 <= i < self._n_vocab for i in ids):
            return int(ids[0]), int(ids[1]), int(ids[2])
        return None

    def create_completion(self, prompt: Union[str, list[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None,
                          echo: bool = False, stop: Optional[Union[str, list[str]]] = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: Optional[int] = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                          stopping_criteria=None, logits_processor=None, grammar=None,
                          logit_bias: Optional[dict] = None, repeat_last_n: Optional[int] = None, **kwargs):
        """Completes `prompt`; returns a completion dict, or an iterator of chunks with stream=True.
        The parameters are llama-cpp-python's, in its order (see the README for the ones refused).

        max_tokens None or <= 0 generates until the context is full; a suffix is placed with the
        model's fill-in-the-middle tokens when it has them, else appended to the returned text.
        """
        self._check_call_keywords("create_completion", kwargs, typical_p=typical_p, tfs_z=tfs_z,
                                  mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                                  mirostat_eta=mirostat_eta)
        constraint = request_constraint(grammar=grammar)
        with self._guard.call():
            run = self._completion_run(prompt, suffix, max_tokens, stop, echo, logprobs, model,
                                       (temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                                        frequency_penalty, presence_penalty, logit_bias),
                                       logits_processor, stopping_criteria, constraint)
            if not stream:
                return run.response()
        return GuardedStream(self._guard, run.chunks)

    def _completion_run(self, prompt, suffix, max_tokens, stop, echo, logprobs, model,
                        sampling: tuple, logits_processor=None, stopping_criteria=None,
                        constraint=None) -> "_CompletionRun":
        """The checked arguments of one completion (the caller holds the guard); `sampling` is
        _sampler_args' arguments, `constraint` a constrained.Constraint or None."""
        self._live()
        matcher = None if constraint is None else constraint.matcher(self._constraint_vocab.get())
        processor = _callables("logits_processor", logits_processor)
        stopper = _callables("stopping_criteria", stopping_criteria)
        if suffix is not None and not isinstance(suffix, str):
            raise BonsaiError(f"suffix must be a string, not {type(suffix).__name__}")
        prompt_tokens, suffix_placed = self._prompt_tokens(prompt, suffix)
        if max_tokens is not None:
            max_tokens = check_int("max_tokens", max_tokens, INT64_MIN, INT64_MAX)
        room = self._n_ctx - len(prompt_tokens)
        max_tokens = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        if logprobs is not None:
            logprobs = check_int("logprobs", logprobs, 0, INT32_MAX)
            if echo and not self._logits_all:
                raise BonsaiError("logprobs with echo=True needs the prompt's logits: "
                                  "create the Llama with logits_all=True")
        stops = normalize_stop(stop)
        sampler_args = self._sampler_args(*sampling)  # validated now, not at the first next() of a stream
        if isinstance(prompt, str):
            prompt_text = prompt
        else:
            prompt_text = bytes(self._model.detokenize(prompt_tokens)).decode("utf-8", errors="ignore")
        append = None if suffix_placed else suffix
        return _CompletionRun(self, prompt_tokens, prompt_text, max_tokens, stops, sampler_args,
                              echo=bool(echo), logprobs=logprobs, suffix=append,
                              model=model if model is not None else self.model_path,
                              processor=processor, stopper=stopper, matcher=matcher)

    def __call__(self, prompt: Union[str, list[int]], *args, **kwargs):
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages: list[dict], functions=None, function_call=None,
                               tools: Optional[list] = None, tool_choice=None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0,
                               stream: bool = False, stop: Optional[Union[str, list[str]]] = None,
                               seed: Optional[int] = None, response_format=None, max_tokens: Optional[int] = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                               logits_processor=None, grammar=None, logit_bias: Optional[dict] = None,
                               logprobs: Optional[bool] = None, top_logprobs: Optional[int] = None,
                               repeat_last_n: Optional[int] = None, parallel_tool_calls: Optional[bool] = None,
                               chat_template_kwargs: Optional[dict] = None, **kwargs):
        """Renders `messages` with the chat template (or chat_format) and completes it as the
        assistant's turn. Extra template variables (e.g. enable_thinking) go in chat_template_kwargs.
        `tools` / `tool_choice` / `parallel_tool_calls` work as in the OpenAI API (tool_calls.py)."""
        self._check_call_keywords("create_chat_completion", kwargs, functions=functions,
                                  function_call=function_call, typical_p=typical_p,
                                  tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                                  mirostat_eta=mirostat_eta)
        constraint = request_constraint(response_format=response_format, grammar=grammar)
        plan = plan_tools(tools, tool_choice, self._chat.source, parallel_tool_calls)
        if plan.forced:
            if constraint is not None:
                raise BonsaiError(f"tool_choice {tool_choice!r} forces a tool call, so it cannot be combined with "
                                  f"{constraint.param}; drop one of them")
            constraint = plan.constraint(self._special_id)
        if chat_template_kwargs is None:
            chat_template_kwargs = {}
        if not isinstance(chat_template_kwargs, dict) or not all(isinstance(k, str) for k in chat_template_kwargs):
            raise BonsaiError("chat_template_kwargs must be a dict of template variable names to values, "
                              "e.g. {'enable_thinking': False}")
        reserved = {"messages", "add_generation_prompt", "tools", "bos_token", "eos_token"} & set(chat_template_kwargs)
        if reserved:
            raise BonsaiError(f"chat_template_kwargs cannot set {', '.join(sorted(reserved))}: the chat "
                              "completion sets them itself")
        with self._guard.call():
            self._live()
            if logprobs and top_logprobs is not None:
                top_logprobs = check_int("top_logprobs", top_logprobs, 0, INT32_MAX)
            prompt = self._chat.render(plan.messages(messages), add_generation_prompt=True, text_only=True,
                                       tools=plan.template_tools(), **chat_template_kwargs)
            tokens = self._tokenize(_utf8(prompt, "the rendered chat prompt"), False, True)
            if self._add_bos and tokens[:1] != [self.token_bos()]:
                tokens.insert(0, self.token_bos())
            if not tokens:
                raise BonsaiError("the chat template rendered an empty prompt; check the messages "
                                  "and the template")
            stops = normalize_stop(stop)
            if self._chat.eos_token:
                stops.append(self._chat.eos_token)
            stops.extend(s for s in self._chat_stops if s not in stops)
            run = self._completion_run(tokens, None, max_tokens, stops, False,
                                       (top_logprobs or 0) if logprobs else None, model,
                                       (temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
                                        frequency_penalty, presence_penalty, logit_bias), logits_processor,
                                       constraint=constraint)
            if not stream:
                return apply_to_response(plan, fmt.chat_response(run.response()))
        if not plan.active:
            return GuardedStream(self._guard, lambda: fmt.chat_chunks(run.chunks()))
        tool_filter = ChunkFilter(plan)
        return GuardedStream(self._guard, lambda: (c for chunk in fmt.chat_chunks(run.chunks())
                                                   for c in tool_filter(chunk)))

    def _special_id(self, text: str) -> Optional[int]:
        return special_token_id(self.metadata, lambda b: self._tokenize(b, False, True), text)

    def _report(self, n_prompt: int, n_reused: int, t_prompt: float, n_gen: int, t_gen: float) -> None:
        if self.verbose and not self._no_perf:
            rate = n_gen / t_gen if t_gen > 0 else 0.0
            print(f"bonsai: prompt {n_prompt} tokens ({n_reused} reused) in {t_prompt:.3f} s, "
                  f"{n_gen} generated in {t_gen:.3f} s ({rate:.1f} tokens/s)", file=sys.stderr)


def _parameter_names(method) -> list[str]:
    """The keyword names a method takes (its **kwargs catches only misspellings)."""
    return [n for n, p in inspect.signature(method).parameters.items()
            if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _callables(name: str, value: Any) -> Optional[list]:
    """llama-cpp-python's logits_processor / stopping_criteria: a callable (its LogitsProcessorList /
    StoppingCriteriaList are) or a list of callables, as a list; None when absent."""
    if value is None:
        return None
    fs = list(value) if isinstance(value, (list, tuple)) and not callable(value) else [value]
    if not all(callable(f) for f in fs):
        raise BonsaiError(f"{name} must be a callable f(input_ids, scores) or a list of them, "
                          f"not {type(value).__name__}")
    return fs


class _CompletionRun:
    """One completion: drives `Llama.generate`, assembles text through a `TextStream` and formats
    the result as a response or as stream chunks."""

    def __init__(self, llama: Llama, prompt_tokens, prompt_text, max_tokens, stops, sampler_args, *,
                 echo, logprobs, suffix, model, processor=None, stopper=None, matcher=None):
        self.llama = llama
        self.matcher = matcher  # constrained.Matcher: masks each row (after logits_processor), advances per token
        if matcher is not None:
            processor = list(processor or []) + [lambda input_ids, row: matcher.allowed_mask(row)]
        self.processor = processor
        self.stopper = stopper
        self.prompt_tokens = prompt_tokens
        self.prompt_text = prompt_text
        self.max_tokens = max_tokens
        self.stops = stops
        self.sampler_args = sampler_args
        self.echo = echo
        self.logprobs = logprobs
        self.suffix = suffix
        self.model = model
        self.id, self.created = fmt.new_completion_id()
        self.tokens: list[int] = []
        self.rows: list[np.ndarray] = []
        self.finish_reason = "length"

    def _pieces(self) -> Iterator[tuple[str, int, int]]:
        """Yields (text, first, end): emitted text and the completion tokens [first, end) it ends."""
        llama = self.llama
        ts = TextStream(self.stops)
        first = 0
        t0 = time.perf_counter()
        t_prompt = 0.0
        args = self.sampler_args
        gen = llama._generate(self.prompt_tokens, llama._make_sampler(args), args["repeat_last_n"], True,
                              self.processor, self.stopper)
        try:
            while len(self.tokens) < self.max_tokens:
                token = next(gen, None)
                if not self.tokens:
                    t_prompt = time.perf_counter() - t0
                if token is None or token in llama._eog:  # None: stopping_criteria ended it
                    self.finish_reason = "stop"
                    break
                if self.matcher is not None:
                    self.matcher.advance(token)
                self.tokens.append(token)
                if self.logprobs is not None:
                    self.rows.append(llama._last_logits.copy())
                text = ts.push(llama._piece(token))
                if text:
                    yield text, first, len(self.tokens)
                    first = len(self.tokens)
                if ts.stopped or (self.matcher is not None and self.matcher.is_done()):
                    self.finish_reason = "stop"
                    break
        finally:
            gen.close()
        tail = ts.finish()
        if tail:
            yield tail, first, len(self.tokens)
        llama._report(len(self.prompt_tokens), llama._n_reused, t_prompt, len(self.tokens),
                      time.perf_counter() - t0 - t_prompt)

    def _logprobs(self, first: int, end: int, text_offset: int) -> Optional[dict]:
        if self.logprobs is None:
            return None
        return fmt.build_logprobs(self.tokens[first:end], self.rows[first:end], self.logprobs,
                                  self.llama._piece, text_offset)

    def _echo_logprobs(self) -> dict:
        llama = self.llama
        toks = self.prompt_tokens
        start = 1 if toks[0] == llama.token_bos() and llama._add_bos else 0
        rows = [None if i == start else np.array(llama.scores[i - 1]) for i in range(start, len(toks))]
        lp = fmt.build_logprobs(toks[start:], rows, self.logprobs, llama._piece, 0)
        rest = self._logprobs(0, len(self.tokens), len(self.prompt_text))
        for k in lp:
            lp[k].extend(rest[k])
        return lp

    def response(self) -> dict:
        text = "".join(t for t, _, _ in self._pieces())
        if self.echo:
            text = self.prompt_text + text
        if self.suffix:
            text += self.suffix
        if self.logprobs is None:
            lp = None
        elif self.echo:
            lp = self._echo_logprobs()
        else:
            lp = self._logprobs(0, len(self.tokens), len(self.prompt_text))
        return fmt.completion_response(self.id, self.created, self.model, text, lp, self.finish_reason,
                                       len(self.prompt_tokens), len(self.tokens))

    def chunks(self) -> Iterator[dict]:
        def chunk(text, lp, reason=None):
            return fmt.completion_chunk(self.id, self.created, self.model, text, lp, reason)

        offset = len(self.prompt_text)
        if self.echo:
            yield chunk(self.prompt_text, None)
        for text, first, end in self._pieces():
            yield chunk(text, self._logprobs(first, end, offset))
            offset += len(text)
        if self.suffix:
            yield chunk(self.suffix, None)
        yield chunk("", None, self.finish_reason)
