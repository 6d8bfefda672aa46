"""The serving engine: continuous batching of many generation requests over one `_core.Context`.

The context is created with `n_parallel` sequence ids (the *slots*) and `n_parallel * n_ctx_slot`
KV cells, so every slot can always hold `n_ctx_slot` tokens. A background thread runs steps; each
step is ONE `Context.decode` call whose batch holds, in this order:

1. the newest sampled token of every slot that is generating (one token each), then
2. prefill chunks of slots still evaluating their prompt, oldest first, until the batch holds
   `n_batch` tokens (a long prompt is spread over several steps, so running sequences keep
   producing a token every step while it is evaluated).

Logits are flagged only for the tokens that need sampling: every generating token and the last
prompt token of a slot whose prefill completes in this step. A request joins a free slot at the
next step after it arrives and leaves at the step it finishes (EOG, a stop string, max_tokens, the
slot context full, or cancellation), so the batch changes from step to step. `decode` releases the
GIL, so the HTTP server's event loop keeps running during a step.

Per-slot state: `cached` lists the tokens whose KV sits in the slot's sequence, at positions
0..len(cached)-1, always exactly. Prompt-prefix reuse (`cache_prompt`): a finished request leaves
its KV in its slot; a newcomer takes the free slot whose cached tokens share the longest prefix
with its prompt and drops the rest (`seq_rm`); when another slot (running or idle) shares a longer
prefix, those cells are shared into the chosen slot with `seq_cp` (no K/V bytes copied). At least
the last prompt token is always evaluated, so there are fresh logits to sample from. The cached
KV of a token depends only on the tokens before it, so greedy output is identical with and without
reuse. Without `cache_prompt`, and always on cancellation, a slot's KV is removed at once.

Each request has its own `_core.Sampler` (its own seed and parameters) and its own `TextStream`,
which holds back partial UTF-8 characters and possible stop-string prefixes. Results come back as
`StreamEvent`s through the request's `on_event` callback (called on the scheduler thread; it must
not block) or, without one, through `GenerationRequest.events()`.

Constrained decoding (`GenerationRequest.constraint`, a constrained.Constraint: JSON mode, a JSON
schema or a grammar): the slot gets its own matcher when it is placed; every logits row of that
slot is masked (forbidden tokens at -inf) before its sampler sees it, the matcher advances on each
sampled token, and the request ends with "stop" once the grammar admits no further token.
The masks of all constrained sequences of a step are computed in one call, in parallel.
Requests without a constraint skip all of it. The token table the matchers share is built on the
first constrained request (`constraint_vocabulary()`; the server builds it off the event loop).

Admission is bounded: at most `n_parallel + queue_limit` requests are running or waiting; a
further `submit` raises `QueueFullError`, whose `retry_after` (whole seconds, 1..60) is the mean time
a slot took to serve a request, divided by the number of slots: about when the next slot frees and
the queue takes one more (1 before any request has finished).

Log-probabilities (`GenerationRequest.logprobs`, the number of alternatives to report): for every
completion token the scheduler computes the log-softmax over the full vocabulary of the raw logits
row it sampled from (before temperature, top-k/p, penalties and the ignore_eos mask: the model's
own distribution, as llama.cpp and OpenAI report it), keeps the sampled token's value and the
`logprobs` most likely tokens, and sends them on the event whose text the token ends
(`StreamEvent.logprobs`). Requests without logprobs skip all of it.

Failure containment: every request parameter is range-checked against what the engine takes
(engine_limits) before it is queued. A failure while placing one request (its sampler, its prefix
copy) or sampling for one slot ends that request alone with an "error" event and frees its slot; a
failing `decode` ends the requests of that batch; the thread itself never stops on a request. Should
it stop anyway, every request still running or waiting gets an error event and `submit` raises
`SchedulerUnavailableError`. The thread refreshes a heartbeat every loop turn and every step (and
at least every `_IDLE_BEAT_S` while idle); `health()` reads it without taking a lock: "stopped" when
the thread is dead, "stalled" when it has work but no heartbeat for `stall_timeout` seconds.

Fault injection (tests and the soak only): with `fault_injection=True`, a request's `fault` makes the
scheduler fail it on purpose: "admit" (raise while placing it in a slot), "sample" (raise when its
second token is sampled, after text has been sent), "stall:SECONDS" (the thread sleeps that long
in the request's first step, without a heartbeat). Without the option a request with a fault is refused.
"""

from __future__ import annotations

import collections
import math
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from .engine_limits import INT32_MAX, UINT64_MAX, check_float, check_int
from .errors import BonsaiError
from .sampling_params import check_penalty, normalize_logit_bias
from .text_stream import TextStream, normalize_stop
from .constrained import Constraint, LazyVocabulary, compute_masks
from .vocab_facts import common_prefix_len

__all__ = ["Scheduler", "GenerationRequest", "StreamEvent", "TokenLogprob", "token_logprob", "InvalidRequestError",
           "QueueFullError", "SchedulerUnavailableError", "FAULTS"]

FAULTS = ("admit", "sample", "stall:SECONDS")  # the kinds of `GenerationRequest.fault`
_IDLE_BEAT_S = 0.25  # an idle thread wakes this often to refresh its heartbeat


class InvalidRequestError(BonsaiError):
    """A request parameter is wrong; `param` names it (None when it is not one parameter)."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


class QueueFullError(BonsaiError):
    """The scheduler already holds its maximum number of running and waiting requests;
    `retry_after` is a suggested wait in whole seconds (see the module docstring)."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class SchedulerUnavailableError(BonsaiError):
    """The scheduler is closed or its thread has stopped: it cannot take requests."""


class _InjectedFault(RuntimeError):
    """Raised on purpose by fault injection."""


@dataclass
class StreamEvent:
    """Text produced by a request (`text`, possibly "") or its end (`finish_reason` set: "stop",
    "length", "cancelled" or "error", with `error` the message of the latter). With logprobs asked
    for, `logprobs` holds the TokenLogprobs of the completion tokens this event's text ends."""

    text: str = ""
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    logprobs: Optional[list["TokenLogprob"]] = None


@dataclass
class TokenLogprob:
    """A completion token, its log-probability, and the `top` most likely tokens as (id, logprob),
    most likely first (ties: lower id first); see the module docstring for which distribution."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprob(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The TokenLogprob of `token` sampled from the raw logits `row` (log-softmax in float64)."""
    x = np.asarray(row, dtype=np.float64)
    m = np.max(x)
    lp = x - (m if np.isfinite(m) else 0.0)
    with np.errstate(divide="ignore"):
        lp -= np.log(np.sum(np.exp(lp)))
    k = min(n_top, lp.shape[0])
    top: list[tuple[int, float]] = []
    if k > 0:
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.lexsort((idx, -lp[idx]))]
        top = [(int(i), float(lp[i])) for i in idx]
    return TokenLogprob(int(token), float(lp[token]), top)


def _invalid(message: str, name: str) -> InvalidRequestError:
    return InvalidRequestError(message, name)


def _int_param(name: str, value: Any, lo: int = 0, hi: int = INT32_MAX) -> int:
    return check_int(name, value, lo, hi, error=_invalid)


def _float_param(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    v = check_float(name, value, lo, hi, lo_open=lo_open, error=_invalid)
    if lo_open and not np.float32(v) > lo:  # the sampler takes a C float: 5e-324 would arrive as 0
        raise InvalidRequestError(f"{name} must be > {lo} also as a 32-bit float (at least "
                                  f"{float(np.finfo(np.float32).smallest_subnormal):.3g}), got {value}", name)
    return v


def _parse_fault(fault: Any) -> Optional[tuple[str, float]]:
    """("admit" | "sample" | "stall", seconds) of a `fault` value, None for None."""
    if fault is None:
        return None
    if isinstance(fault, str):
        if fault in ("admit", "sample"):
            return fault, 0.0
        kind, _, seconds = fault.partition(":")
        if kind == "stall":
            try:
                v = float(seconds)
            except ValueError:
                v = -1.0
            if 0 < v <= 3600:
                return kind, v
    raise InvalidRequestError(f"fault must be one of {', '.join(FAULTS)} (SECONDS in (0, 3600]), got {fault!r}",
                              "fault")


class GenerationRequest:
    """One generation: prompt tokens, sampling parameters and limits. Parameters are validated here
    (InvalidRequestError names the bad one). `max_tokens` None or <= 0 means "until the slot
    context is full"; `ignore_eos` masks the end-of-generation tokens out of sampling.
    `logprobs` (None = off) is how many most likely alternatives to report with each token's
    log-probability. `cancel()` may be called from any thread at any time."""

    def __init__(self, prompt_tokens: Sequence[int], *, max_tokens: Optional[int] = 16,
                 stop: Any = None, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: Optional[int] = None, ignore_eos: bool = False, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, logit_bias: Optional[dict] = None,
                 on_event: Optional[Callable[[StreamEvent], None]] = None, fault: Optional[str] = None,
                 logprobs: Optional[int] = None, constraint: Optional[Constraint] = None):
        if not isinstance(prompt_tokens, (list, tuple)) or not prompt_tokens:
            raise InvalidRequestError("the prompt is empty; give some text or token ids", "prompt")
        self.prompt_tokens = [check_int("a prompt token id", t, -2**31, INT32_MAX,
                                        error=lambda m, _: InvalidRequestError(m, "prompt")) for t in prompt_tokens]
        self.max_tokens = None if max_tokens is None else _int_param("max_tokens", max_tokens, -2**31)
        try:
            self.stop = normalize_stop(stop)
        except BonsaiError as e:
            raise InvalidRequestError(str(e), "stop") from None
        self.temperature = _float_param("temperature", temperature, 0.0, 100.0)
        self.top_k = _int_param("top_k", top_k)
        self.top_p = _float_param("top_p", top_p, 0.0, 1.0, lo_open=True)
        self.min_p = _float_param("min_p", min_p, 0.0, 1.0)
        self.repeat_penalty = _float_param("repeat_penalty", repeat_penalty, 0.0, 100.0, lo_open=True)
        self.repeat_last_n = _int_param("repeat_last_n", repeat_last_n)
        self.frequency_penalty = check_penalty("frequency_penalty", frequency_penalty, error=_invalid)
        self.presence_penalty = check_penalty("presence_penalty", presence_penalty, error=_invalid)
        self.logit_bias = normalize_logit_bias(logit_bias, None, error=_invalid)  # ids < n_vocab: submit()
        if seed is not None:
            seed = _int_param("seed", seed, 0, UINT64_MAX) & 0xFFFFFFFF
        self.seed = seed if seed is not None else random.SystemRandom().randrange(0, 0xFFFFFFFF)
        if not isinstance(ignore_eos, bool):
            raise InvalidRequestError(f"ignore_eos must be a boolean, not {type(ignore_eos).__name__}", "ignore_eos")
        self.ignore_eos = ignore_eos  # never sample an end-of-generation token (benchmarks, soak tests)
        self.logprobs = None if logprobs is None else _int_param("logprobs", logprobs)
        if constraint is not None and not isinstance(constraint, Constraint):
            raise InvalidRequestError(f"constraint must be a constrained.Constraint, not {type(constraint).__name__}",
                                      "constraint")
        if constraint is not None and ignore_eos:
            raise InvalidRequestError("ignore_eos cannot be combined with a response_format / grammar: the grammar "
                                      "decides where the output ends; drop ignore_eos", "ignore_eos")
        self.constraint = constraint  # JSON mode / schema / grammar (None: unconstrained)
        self.id: Optional[int] = None  # the task number, given at submission
        self.fault = fault
        self._fault = _parse_fault(fault)
        self._on_event = on_event
        self._events: "queue.Queue[StreamEvent]" = queue.Queue()
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self.finish_reason: Optional[str] = None
        self.completion_tokens: list[int] = []
        self.n_reused = 0  # prompt tokens whose KV came from the prefix cache
        self.t_submit = 0.0
        self.t_first_token: Optional[float] = None
        self.t_start = 0.0  # when it got a slot
        self._scheduler: Optional["Scheduler"] = None

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_tokens)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Asks the scheduler to drop this request; its slot and KV are freed before the next step."""
        self._cancelled.set()
        if self._scheduler is not None:
            self._scheduler._wake()

    def _emit(self, ev: StreamEvent) -> None:
        """Delivers `ev`; never raises. A callback that raises cancels its request (nobody can
        receive its events any more)."""
        if ev.finish_reason is not None:
            self.finish_reason = ev.finish_reason
        try:
            if self._on_event is not None:
                self._on_event(ev)
            else:
                self._events.put(ev)
        except Exception:
            self._cancelled.set()
        if ev.finish_reason is not None:
            self._done.set()

    def events(self, timeout: Optional[float] = None) -> Iterator[StreamEvent]:
        """The events of a request submitted without `on_event`, up to and including the last one.
        Raises queue.Empty when none arrives within `timeout` seconds."""
        while True:
            ev = self._events.get(timeout=timeout)
            yield ev
            if ev.finish_reason is not None:
                return

    def result(self, timeout: Optional[float] = None) -> tuple[str, str]:
        """Waits for the end; returns (text, finish_reason). Raises BonsaiError on an engine error."""
        parts = []
        for ev in self.events(timeout):
            parts.append(ev.text)
            if ev.finish_reason == "error":
                raise BonsaiError(ev.error or "generation failed")
        return "".join(parts), self.finish_reason or ""

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)


class _Slot:
    """One sequence id of the context and the request it serves."""

    def __init__(self, seq: int):
        self.seq = seq
        self.cached: list[int] = []  # tokens whose KV is in sequence `seq`, positions 0..len-1
        self.req: Optional[GenerationRequest] = None
        self.pending: list[int] = []  # prompt tokens still to evaluate
        self.next_token: Optional[int] = None  # sampled, to be evaluated in the next step
        self.sampler = None
        self.matcher = None  # constrained.Matcher of a constrained request
        self.stream: Optional[TextStream] = None
        self.logprobs: list[TokenLogprob] = []  # of tokens whose text has not been sent yet
        self.max_tokens = 0
        self.last_used = 0.0
        self.admitted = 0  # admission order (prefill fairness)


class Scheduler:
    """Continuous-batching scheduler; see the module docstring. `model` is a `_core.Model`;
    `eog_ids` the ids that end a generation (see vocab_facts.end_of_generation_ids)."""

    def __init__(self, model: Any, *, eog_ids: Sequence[int], n_parallel: int = 1, n_ctx_slot: int = 2048,
                 n_batch: int = 512, n_threads: int = 0, cache_prompt: bool = True, queue_limit: int = 64,
                 type_k: str = "f16", type_v: str = "f16", act_mode: str = "int8", flash_attn: bool = False,
                 fault_injection: bool = False, stall_timeout: float = 120.0):
        from . import _core

        self.n_parallel = check_int("n_parallel", n_parallel, 1, 64)
        self.n_ctx_slot = check_int("n_ctx_slot", n_ctx_slot, 2)
        if self.n_parallel * self.n_ctx_slot > INT32_MAX:
            raise BonsaiError(f"{self.n_parallel} slots x {self.n_ctx_slot} tokens = "
                              f"{self.n_parallel * self.n_ctx_slot} KV cells is more than the engine's limit of "
                              f"{INT32_MAX}; lower the context per slot or the number of slots")
        self.n_batch = max(check_int("n_batch", n_batch, 1), self.n_parallel)
        self.queue_limit = check_int("queue_limit", queue_limit, 0, 2**62)
        self.cache_prompt = bool(cache_prompt)
        self.fault_injection = bool(fault_injection)
        self.stall_timeout = check_float("stall_timeout", stall_timeout, 0.0, 1e9, lo_open=True)
        self._model = model
        self._eog = frozenset(int(i) for i in eog_ids)
        self._eog_index = np.array(sorted(self._eog), dtype=np.int64)
        self._vocab = LazyVocabulary(model, model.n_vocab, sorted(self._eog))
        self._ctx = _core.Context(model, n_ctx=self.n_parallel * self.n_ctx_slot, n_batch=self.n_batch,
                                  n_seq_max=self.n_parallel, n_threads=check_int("n_threads", n_threads),
                                  type_k=type_k, type_v=type_v, act_mode=act_mode, flash_attn=bool(flash_attn))
        self._core = _core
        self._slots = [_Slot(i) for i in range(self.n_parallel)]
        self._waiting: collections.deque[GenerationRequest] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._death: Optional[str] = None  # why the thread stopped, if it stopped on its own
        self._beat = time.monotonic()  # the thread's heartbeat (see health())
        self._pieces: dict[int, bytes] = {}
        self._n_admitted = 0
        self._metrics = {"requests_total": 0, "requests_rejected_total": 0, "prompt_tokens_total": 0,
                         "prompt_tokens_reused_total": 0, "generated_tokens_total": 0, "decode_steps_total": 0,
                         "busy_seconds_total": 0.0, "first_token_seconds_sum": 0.0, "first_token_count": 0,
                         "served_seconds_sum": 0.0, "served_count": 0}
        self._n_submitted = 0
        self._finished = collections.Counter()
        self._thread = threading.Thread(target=self._run, name="bonsai-scheduler", daemon=True)
        self._thread.start()

    # ---- public API -------------------------------------------------------------------------

    def constraint_vocabulary(self):
        """The token table of constrained requests (built once, about 1 s for a 152k vocabulary)."""
        return self._vocab.get()

    def submit(self, req: GenerationRequest) -> GenerationRequest:
        """Queues `req`; raises QueueFullError when full, InvalidRequestError when the prompt does
        not fit a slot, BonsaiError when the scheduler is closed."""
        if req.n_prompt >= self.n_ctx_slot:
            raise InvalidRequestError(
                f"the prompt has {req.n_prompt} tokens but a slot holds {self.n_ctx_slot} (prompt + completion); "
                "shorten the prompt or start the server with a larger --ctx-size", "prompt")
        n_vocab = int(self._model.n_vocab)
        bad = next((t for t in req.prompt_tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"invalid token id {bad}: ids must be in [0, {n_vocab})", "prompt")
        bad = next((t for t in req.logit_bias or () if t >= n_vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"logit_bias key {bad} is not a token id of this model: ids are in "
                                      f"[0, {n_vocab})", "logit_bias")
        if req.fault is not None and not self.fault_injection:
            raise InvalidRequestError("fault injection is disabled (a debugging option of the scheduler)", "fault")
        with self._cond:
            if self._closed:
                raise SchedulerUnavailableError("the server is shutting down; retry on another instance")
            if self._death is not None or not self._thread.is_alive():
                raise SchedulerUnavailableError(f"the scheduler has stopped ({self._death or 'its thread exited'}); "
                                                "restart the server")
            running = sum(s.req is not None for s in self._slots)
            if running + len(self._waiting) >= self.n_parallel + self.queue_limit:
                self._metrics["requests_rejected_total"] += 1
                retry = self._retry_after()
                raise QueueFullError(f"the server is busy: {running} requests running and {len(self._waiting)} "
                                     f"waiting (--parallel {self.n_parallel}, --queue-limit {self.queue_limit}); "
                                     f"retry in {retry} s", retry)
            self._n_submitted += 1
            req.id = self._n_submitted
            req._scheduler = self
            req.t_submit = time.perf_counter()
            self._waiting.append(req)
            self._metrics["requests_total"] += 1
            self._cond.notify_all()
        return req

    def _retry_after(self) -> int:
        """Seconds until a slot is expected to free (the caller holds the lock): see the module docstring."""
        n = self._metrics["served_count"]
        if n == 0:
            return 1
        per_slot = self._metrics["served_seconds_sum"] / n / self.n_parallel
        return min(max(math.ceil(per_slot), 1), 60)

    def close(self) -> None:
        """Stops the thread, ends every request with an error event and frees the context."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        for slot in self._slots:
            if slot.req is not None:
                self._end(slot, StreamEvent(finish_reason="error", error="the server is shutting down"))
        while self._waiting:
            self._waiting.popleft()._emit(StreamEvent(finish_reason="error", error="the server is shutting down"))
        self._ctx.close()

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict:
        """Counters and gauges for /metrics (a consistent snapshot)."""
        with self._cond:
            out = dict(self._metrics)
            out["queue_depth"] = len(self._waiting)
            out["slots_busy"] = sum(s.req is not None for s in self._slots)
            out["slots_total"] = self.n_parallel
            out["cached_tokens"] = sum(len(s.cached) for s in self._slots)
            out["finished"] = dict(self._finished)
        busy = out["busy_seconds_total"]
        out["generated_tokens_per_second"] = out["generated_tokens_total"] / busy if busy > 0 else 0.0
        return out

    def health(self) -> dict:
        """Liveness without taking the scheduler's lock (a stuck thread may hold it): `state` "ok",
        "closed", "stopped" (the thread is dead) or "stalled" (work is waiting or running and the
        thread has not refreshed its heartbeat for more than `stall_timeout` s), `detail` why, and
        the slot and queue counts (read without the lock, so possibly one step old)."""
        busy = sum(s.req is not None for s in self._slots)
        waiting = len(self._waiting)
        silent = time.monotonic() - self._beat
        out = {"state": "ok", "detail": "", "slots_busy": busy, "slots_total": self.n_parallel,
               "queue_depth": waiting, "seconds_since_heartbeat": round(silent, 3)}
        if self._closed:
            out.update(state="closed", detail="the scheduler is shutting down")
        elif self._death is not None or not self._thread.is_alive():
            out.update(state="stopped", detail=f"the scheduler thread has stopped: {self._death or 'it exited'}")
        elif (busy or waiting) and silent > self.stall_timeout:
            out.update(state="stalled", detail=f"no scheduler progress for {silent:.1f} s (limit {self.stall_timeout:g} s) "
                       f"with {busy} requests running and {waiting} waiting")
        return out

    def slots(self) -> list[dict]:
        """One dict per slot (GET /slots): `id`, `n_ctx`, `is_processing`, `n_cached_tokens`, and
        while busy the request's `id_task`, `n_prompt_tokens`, `n_prompt_tokens_cached` (reused from
        the prefix cache), `n_prompt_tokens_pending` (still to evaluate) and `n_decoded`."""
        with self._cond:
            out = []
            for s in self._slots:
                d = {"id": s.seq, "n_ctx": self.n_ctx_slot, "is_processing": s.req is not None,
                     "n_cached_tokens": len(s.cached)}
                if s.req is not None:
                    d.update(id_task=s.req.id, n_prompt_tokens=s.req.n_prompt,
                             n_prompt_tokens_cached=s.req.n_reused, n_prompt_tokens_pending=len(s.pending),
                             n_decoded=len(s.req.completion_tokens))
                out.append(d)
            return out

    def slot_tokens(self) -> list[list[int]]:
        """The cached tokens of each slot (for tests and diagnostics)."""
        with self._cond:
            return [list(s.cached) for s in self._slots]

    # ---- scheduler thread -------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as e:  # not a request's failure (those are caught below): the thread ends
            self._death = f"{type(e).__name__}: {e}"
            try:
                with self._cond:
                    self._fail_all(f"the scheduler stopped: {self._death}")
            except Exception:  # the thread is ending either way; the death is recorded above
                pass
            raise

    def _turn(self) -> bool:
        """One loop turn: drop cancelled requests, admit waiting ones, run one step. False once closed."""
        with self._cond:
            while True:
                self._beat = time.monotonic()
                if self._closed:
                    return False
                self._drop_cancelled()
                self._admit()
                if any(s.req is not None for s in self._slots):
                    break
                self._cond.wait(min(_IDLE_BEAT_S, self.stall_timeout / 4))
        t0 = time.perf_counter()
        try:
            self._step()
        except Exception as e:  # an engine failure ends the requests of this batch, not the server
            with self._cond:
                self._fail_all(f"generation failed: {type(e).__name__}: {e}", waiting=False)
        self._beat = time.monotonic()
        with self._cond:
            self._metrics["busy_seconds_total"] += time.perf_counter() - t0
        return True

    def _fail_all(self, message: str, waiting: bool = True) -> None:
        """Ends every running request (and, with `waiting`, every queued one) with an error event."""
        for slot in self._slots:
            if slot.req is not None:
                self._fail(slot, message)
        while waiting and self._waiting:
            self._finished["error"] += 1
            self._waiting.popleft()._emit(StreamEvent(finish_reason="error", error=message))

    def _fail(self, slot: _Slot, message: str) -> None:
        """Ends the slot's request with an error event and frees the slot and its KV."""
        self._end(slot, StreamEvent(finish_reason="error", error=message))
        try:
            self._forget(slot)
        except Exception:  # the KV of a failed sequence: drop what we know of it, the cells are reused
            slot.cached = []

    def _drop_cancelled(self) -> None:
        for slot in self._slots:
            if slot.req is not None and slot.req.cancelled:
                self._end(slot, StreamEvent(finish_reason="cancelled"))
                self._forget(slot)
        if any(r.cancelled for r in self._waiting):
            keep = collections.deque()
            for r in self._waiting:
                if r.cancelled:
                    self._finished["cancelled"] += 1
                    r._emit(StreamEvent(finish_reason="cancelled"))
                else:
                    keep.append(r)
            self._waiting = keep

    def _forget(self, slot: _Slot) -> None:
        self._ctx.seq_rm(slot.seq, -1, -1)
        slot.cached = []

    def _admit(self) -> None:
        while self._waiting:
            free = [s for s in self._slots if s.req is None]
            if not free:
                return
            req = self._waiting.popleft()
            try:
                self._place(req, free)
            except Exception as e:  # this request alone fails; its slot (if it got one) is freed
                message = f"the request could not be started: {type(e).__name__}: {e}"
                slot = next((s for s in self._slots if s.req is req), None)
                if slot is not None:
                    self._fail(slot, message)
                else:
                    self._finished["error"] += 1
                    req._emit(StreamEvent(finish_reason="error", error=message))

    def _place(self, req: GenerationRequest, free: list[_Slot]) -> None:
        prompt = req.prompt_tokens
        limit = len(prompt) - 1  # the last prompt token is always evaluated (fresh logits)
        if self.cache_prompt:
            # the longest prefix each slot can keep exactly (recurrent models: back to a checkpoint)
            def reusable(s: _Slot) -> int:
                return self._ctx.seq_reusable(s.seq, max(min(common_prefix_len(s.cached, prompt), limit), 0))
            own = [(reusable(s), -s.last_used, s) for s in free]
            n_own, _, slot = max(own, key=lambda t: (t[0], t[1]))
            if n_own == 0:  # nothing to reuse here: take the free slot holding the least cache
                slot = min(free, key=lambda s: (len(s.cached), s.last_used))
            donors = [(reusable(s), s) for s in self._slots if s is not slot]
            n_donor, donor = max(donors, key=lambda t: t[0], default=(0, None))
            if donor is not None and n_donor > n_own:
                self._ctx.seq_rm(slot.seq, -1, -1)
                self._ctx.seq_cp(donor.seq, slot.seq, 0, n_donor)
                slot.cached = donor.cached[:n_donor]
            else:
                self._ctx.seq_rm(slot.seq, n_own, -1)
                slot.cached = slot.cached[:n_own]
        else:
            slot = free[0]
            self._forget(slot)
        n_reused = len(slot.cached)
        req.n_reused = n_reused
        req.t_start = time.perf_counter()
        slot.req = req
        slot.logprobs = []
        slot.pending = prompt[n_reused:]
        slot.next_token = None
        if req._fault is not None and req._fault[0] == "admit":
            raise _InjectedFault("injected fault at admission (fault='admit')")
        slot.sampler = self._core.Sampler(temp=req.temperature, top_k=req.top_k, top_p=req.top_p,
                                          min_p=req.min_p, repeat_penalty=req.repeat_penalty,
                                          repeat_last_n=req.repeat_last_n, seed=req.seed,
                                          frequency_penalty=req.frequency_penalty,
                                          presence_penalty=req.presence_penalty, logit_bias=req.logit_bias)
        if req.repeat_last_n > 0:
            for t in prompt[-req.repeat_last_n:]:
                slot.sampler.accept(t)
        slot.stream = TextStream(req.stop)
        slot.matcher = None if req.constraint is None else req.constraint.matcher(self._vocab.get())
        room = self.n_ctx_slot - len(prompt)
        slot.max_tokens = room if req.max_tokens is None or req.max_tokens <= 0 else min(req.max_tokens, room)
        self._n_admitted += 1
        slot.admitted = self._n_admitted
        self._metrics["prompt_tokens_total"] += len(prompt)
        self._metrics["prompt_tokens_reused_total"] += n_reused

    def _step(self) -> None:
        """Builds and runs one batch, then samples; see the module docstring for the batch layout."""
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        want: list[int] = []
        plan: list[tuple[_Slot, int, bool]] = []  # (slot, tokens added, has an output row)
        with self._cond:
            active = [s for s in self._slots if s.req is not None]
        for slot in active:
            fault = slot.req._fault
            if fault is not None and fault[0] == "stall" and not slot.req.completion_tokens:
                slot.req._fault = None  # once
                time.sleep(fault[1])  # without a heartbeat: health() reports "stalled"
        for slot in active:
            if slot.next_token is not None:
                tokens.append(slot.next_token)
                pos.append(len(slot.cached))
                seqs.append(slot.seq)
                want.append(1)
                plan.append((slot, 1, True))
        budget = self.n_batch - len(tokens)
        for slot in sorted((s for s in active if s.pending), key=lambda s: s.admitted):
            if budget <= 0:
                break
            chunk = slot.pending[:budget]
            budget -= len(chunk)
            last = len(chunk) == len(slot.pending)
            p0 = len(slot.cached)
            tokens.extend(chunk)
            pos.extend(range(p0, p0 + len(chunk)))
            seqs.extend([slot.seq] * len(chunk))
            want.extend([0] * (len(chunk) - 1) + [1 if last else 0])
            plan.append((slot, len(chunk), last))
        logits = self._ctx.decode(tokens, pos=pos, seq_ids=seqs, logits=want)
        masked = [slot.matcher for slot, _, has_row in plan if has_row and slot.matcher is not None]
        if len(masked) > 1:  # the constrained sequences' masks at once, on llguidance's threads
            try:
                compute_masks(masked)
            except Exception:  # each matcher then computes (and reports) its own in _sample
                pass
        row = 0
        at = 0
        with self._cond:
            self._metrics["decode_steps_total"] += 1
            for slot, n, has_row in plan:
                evaluated = tokens[at: at + n]
                at += n
                slot.cached.extend(evaluated)
                if slot.pending:
                    slot.pending = slot.pending[n:]
                else:
                    slot.next_token = None
                if has_row:
                    try:
                        self._sample(slot, logits[row])
                    except Exception as e:  # this request alone fails
                        self._fail(slot, f"sampling failed: {type(e).__name__}: {e}")
                    row += 1

    def _piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = bytes(self._model.token_to_piece(int(token)))
        return p

    def _take_logprobs(self, slot: _Slot) -> Optional[list[TokenLogprob]]:
        if slot.req is None or slot.req.logprobs is None:
            return None
        out, slot.logprobs = slot.logprobs, []
        return out

    def _sample(self, slot: _Slot, row: np.ndarray) -> None:
        req = slot.req
        raw = row
        if req.ignore_eos and self._eog_index.size:
            row = row.copy()
            row[self._eog_index] = -np.inf
        if slot.matcher is not None:
            row = slot.matcher.allowed_mask(row)
        if req._fault is not None and req._fault[0] == "sample" and req.completion_tokens:
            raise _InjectedFault("injected fault while sampling (fault='sample')")
        token = int(slot.sampler.sample(row))
        slot.sampler.accept(token)
        if req.t_first_token is None:
            req.t_first_token = time.perf_counter()
            self._metrics["first_token_seconds_sum"] += req.t_first_token - req.t_submit
            self._metrics["first_token_count"] += 1
        if token in self._eog:
            self._end(slot, StreamEvent(finish_reason="stop"))
            return
        if slot.matcher is not None:
            slot.matcher.advance(token)
        req.completion_tokens.append(token)
        self._metrics["generated_tokens_total"] += 1
        if req.logprobs is not None:
            slot.logprobs.append(token_logprob(raw, token, req.logprobs))
        text = slot.stream.push(self._piece(token))
        if text:
            req._emit(StreamEvent(text=text, logprobs=self._take_logprobs(slot)))
        if slot.stream.stopped or (slot.matcher is not None and slot.matcher.is_done()):
            self._end(slot, StreamEvent(finish_reason="stop"))
        elif len(req.completion_tokens) >= slot.max_tokens:
            self._end(slot, StreamEvent(finish_reason="length"))
        else:
            slot.next_token = token

    def _end(self, slot: _Slot, final: StreamEvent) -> None:
        """Finishes the slot's request: releases held-back text, then the final event. The slot's
        KV stays for prefix reuse when cache_prompt is on (cancellation removes it: _forget)."""
        req = slot.req
        if final.finish_reason in ("stop", "length") and slot.stream is not None:
            tail = slot.stream.finish()
            lps = self._take_logprobs(slot)
            if tail or lps:  # the tokens of a stop string or of held-back bytes still get logprobs
                req._emit(StreamEvent(text=tail, logprobs=lps))
            self._metrics["served_seconds_sum"] += time.perf_counter() - req.t_start
            self._metrics["served_count"] += 1
        slot.req = None
        slot.logprobs = []
        slot.pending = []
        slot.next_token = None
        slot.sampler = None
        slot.matcher = None
        slot.stream = None
        slot.last_used = time.perf_counter()
        self._finished[final.finish_reason] += 1
        if not self.cache_prompt:
            self._forget(slot)
        req._emit(final)
