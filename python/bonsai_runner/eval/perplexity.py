"""Perplexity and KL-divergence of a GGUF model on a text, the way llama-perplexity measures them.

Method (llama.cpp's `perplexity` / `kl_divergence`):
- the whole text is tokenized once (with BOS when the vocabulary adds one) and cut into
  n_chunk = n_tokens // n_ctx chunks of n_ctx tokens (--chunks caps the count); the tail that does
  not fill a chunk is not used;
- each chunk runs from an empty KV cache, in batches of n_batch tokens; when the vocabulary adds a
  BOS, the chunk's first token is replaced by BOS (so every chunk starts like a document);
- only the second half is scored: with first = n_ctx // 2, the logits at positions
  first .. n_ctx - 2 predict tokens first + 1 .. n_ctx - 1, so each position has at least half a
  window of context. Per token nll = logsumexp(logits) - logits[target];
- PPL = exp(mean nll). Its uncertainty is the standard error of the mean nll carried through exp:
  sigma = sqrt((E[nll^2] - E[nll]^2) / (N - 1)), PPL +/- PPL * sigma;
- after each chunk the running PPL is printed as `[k]x.xxxx,`.
KL mode reads a reference run (logits_file.py) made on the same tokens and, per scored position,
accumulates KL(P_ref || P_model) = sum_v p_ref(v) (log p_ref(v) - log p_model(v)), whether the two
top tokens agree, and Δp = p_model(next) - p_ref(next) for the actual next token (llama.cpp's Δp);
also the same difference for the reference's top token. The summary prints the PPL of both, their
ratio with its uncertainty (using the correlation of the two per-token nll series), KL mean,
median and percentiles, Δp statistics and the same-top-token share, as llama-perplexity does.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..errors import BonsaiError
from .logits_file import LogitsWriter, ReferenceLogits, choose_dtype

SIZE_WARNING_BYTES = 1 << 30


def default_eval_file() -> str:
    return str(resources.files("bonsai_runner") / "data" / "eval.txt")


def read_text(path: str | os.PathLike) -> str:
    p = Path(path)
    if not p.is_file():
        raise BonsaiError(f"text file not found: {path} (give --file a UTF-8 text file, or omit "
                          "it to use the built-in evaluation text)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BonsaiError(f"{path} is not UTF-8 text ({e}); convert it to UTF-8") from None
    if not text.strip():
        raise BonsaiError(f"{path} is empty; perplexity needs text to score")
    return text


@dataclass
class PerplexityOptions:
    model: str
    file: Optional[str] = None             # None: the built-in evaluation text
    ctx_size: Optional[int] = None         # None: 512, or the reference's with kl_divergence
    chunks: int = -1                       # -1: every full chunk (or the reference's count)
    batch_size: int = 512
    threads: int = 0                       # 0: the engine's default
    act_mode: str = "int8"
    save_logits: Optional[str] = None
    kl_divergence: Optional[str] = None


@dataclass
class KlStats:
    kld: np.ndarray                        # per scored token
    p_diff: np.ndarray                     # p_model(next) - p_ref(next)
    p_diff_top: np.ndarray                 # p_model(ref top) - p_ref(ref top)
    same_top: np.ndarray                   # bool per scored token
    nll_ref: np.ndarray


@dataclass
class PerplexityResult:
    model: str
    n_ctx: int
    n_chunks: int
    nll: np.ndarray                        # per scored token, float64
    kl: Optional[KlStats] = None
    chunk_ppl: list = field(default_factory=list)

    @property
    def ppl(self) -> float:
        return math.exp(float(self.nll.mean()))

    @property
    def ppl_err(self) -> float:
        return self.ppl * mean_and_sigma(self.nll)[1]


def mean_and_sigma(x: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of the mean (0 when undefined)."""
    n = x.size
    if n == 0:
        return 0.0, 0.0
    m = float(x.mean())
    var = float((x * x).mean()) - m * m
    return m, math.sqrt(var / (n - 1)) if var > 0 and n > 1 else 0.0


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    """float32 log-softmax per row, the normalizer summed in float64."""
    m = logits.max(axis=1, keepdims=True)
    s = np.exp(logits - m).sum(axis=1, keepdims=True, dtype=np.float64)
    return (logits - (m + np.log(s)).astype(np.float32)).astype(np.float32)


class _Engine:
    """A model and one context, closed together."""

    def __init__(self, path: str, n_ctx: int, n_batch: int, threads: int, act_mode: str):
        from .. import _core

        if not hasattr(_core, "Model"):
            raise BonsaiError("the native engine (bonsai_runner._core) is not built: run "
                              "`pip install .` or scripts/dev_build.sh")
        if not Path(path).is_file():
            raise BonsaiError(f"model file not found: {path}")
        self.model = _core.Model(path)
        try:
            self.ctx = _core.Context(self.model, n_ctx=n_ctx, n_batch=min(n_batch, n_ctx),
                                     n_seq_max=1, n_threads=threads, act_mode=act_mode)
        except BaseException:
            self.model.close()
            raise
        self.n_vocab = int(self.model.n_vocab)
        with_bos = self.model.tokenize(b"a", add_special=True, parse_special=False)
        without = self.model.tokenize(b"a", add_special=False, parse_special=False)
        bos = int(self.model.bos)
        self.add_bos = bos >= 0 and with_bos[:1] == [bos] and without[:1] != [bos]
        self.bos = bos

    def tokenize(self, text: str) -> np.ndarray:
        return np.asarray(self.model.tokenize(text.encode("utf-8"), add_special=self.add_bos,
                                              parse_special=False), dtype=np.int32)

    def chunk_logits(self, tokens: np.ndarray, first: int, n_batch: int) -> np.ndarray:
        """Logits [n_ctx - 1 - first, n_vocab] of positions first .. n_ctx - 2 of one chunk."""
        n_ctx = tokens.size
        self.ctx.clear()
        want = np.zeros(n_ctx, dtype=np.int32)
        want[first:n_ctx - 1] = 1
        rows = []
        for a in range(0, n_ctx, n_batch):
            b = min(a + n_batch, n_ctx)
            out = self.ctx.decode(tokens[a:b], pos=np.arange(a, b, dtype=np.int32),
                                  logits=want[a:b])
            if out.shape[0]:
                rows.append(out)
        return np.concatenate(rows) if len(rows) > 1 else rows[0]

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def sequence_nll(model: str, sequences: np.ndarray, act_mode: str = "int8",
                 threads: int = 0) -> float:
    """Mean next-token negative log-likelihood (nats) of the engine running `model` on each
    token sequence of [N, T] (every position but the last predicts the next; each sequence on a
    cleared context): the engine's side of the quantizer's held-out loss
    (quantize/sensitivity.py), on the same token ids."""
    seqs = np.ascontiguousarray(sequences, dtype=np.int32)
    if seqs.ndim != 2 or seqs.shape[1] < 2:
        raise BonsaiError(f"sequence_nll: token sequences [N, T >= 2] wanted, got {seqs.shape}")
    eng = _Engine(model, seqs.shape[1], seqs.shape[1], threads, act_mode)
    try:
        tot = 0.0
        for row in seqs:
            lp = log_softmax_rows(eng.chunk_logits(row, 0, row.size))
            tot += float(-lp[np.arange(row.size - 1), row[1:]].astype(np.float64).sum())
    finally:
        eng.close()
    return tot / (seqs.shape[0] * (seqs.shape[1] - 1))


def _resolve_shape(opts: PerplexityOptions, ref: Optional[ReferenceLogits]) -> tuple[int, int]:
    n_ctx = opts.ctx_size
    chunks = opts.chunks
    if ref is not None:
        if n_ctx is not None and n_ctx != ref.n_ctx:
            raise BonsaiError(f"--ctx-size {n_ctx} differs from the reference's {ref.n_ctx} "
                              f"({ref.path}); omit --ctx-size or make the reference again")
        n_ctx = ref.n_ctx
        if chunks is None or chunks < 0 or chunks > ref.n_chunks:
            chunks = ref.n_chunks
    n_ctx = 512 if n_ctx is None else n_ctx
    if n_ctx < 4:
        raise BonsaiError(f"--ctx-size {n_ctx}: use at least 4 tokens (llama.cpp's default is 512)")
    if opts.batch_size < 1:
        raise BonsaiError(f"--batch-size {opts.batch_size}: must be at least 1")
    if chunks is None:
        chunks = -1
    if chunks == 0:
        raise BonsaiError("--chunks 0: give a positive count, or -1 for every chunk")
    return n_ctx, chunks


def run_perplexity(opts: PerplexityOptions, out: Callable[[str], None] | None = None,
                   log: Callable[[str], None] | None = None) -> PerplexityResult:
    """Runs the measurement; `out` receives the report text (progress included), `log` notes."""
    out = out or (lambda s: print(s, end="", flush=True))
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    path = opts.file or default_eval_file()
    text = read_text(path)
    if opts.save_logits and opts.kl_divergence:
        raise BonsaiError("--save-logits and --kl-divergence are two runs: save the reference "
                          "with the F16 model first, then compare the candidate against it")
    ref = ReferenceLogits(opts.kl_divergence) if opts.kl_divergence else None
    n_ctx, chunks = _resolve_shape(opts, ref)
    eng = _Engine(opts.model, n_ctx, opts.batch_size, opts.threads, opts.act_mode)
    try:
        return _measure(eng, opts, text, path, n_ctx, chunks, ref, out, log)
    finally:
        eng.close()
        if ref is not None:
            ref.close()


def _measure(eng, opts, text, path, n_ctx, chunks, ref, out, log) -> PerplexityResult:
    tokens = eng.tokenize(text)
    n_max = tokens.size // n_ctx
    if n_max < 1:
        raise BonsaiError(f"{path}: {tokens.size} tokens, fewer than one chunk of --ctx-size "
                          f"{n_ctx}; give a longer text or a smaller --ctx-size")
    n_chunk = n_max if chunks < 0 else min(chunks, n_max)
    first = n_ctx // 2
    n_scored = n_ctx - 1 - first
    used = tokens[:n_chunk * n_ctx].copy()
    if eng.add_bos:
        used[::n_ctx] = eng.bos
    if ref is not None:
        _check_reference(ref, eng, used, opts.model)
    log(f"perplexity: {tokens.size} tokens in {path}; {n_chunk} chunk(s) of {n_ctx} "
        f"(scoring the last {n_scored} of each), batch {min(opts.batch_size, n_ctx)}")
    writer = None
    if opts.save_logits:
        dtype = choose_dtype(n_chunk * n_scored, eng.n_vocab)
        size = n_chunk * n_scored * eng.n_vocab * np.dtype(dtype).itemsize
        header = {"n_vocab": eng.n_vocab, "n_ctx": n_ctx, "n_chunks": n_chunk, "first": first,
                  "n_tokens": int(used.size), "dtype": dtype, "add_bos": eng.add_bos,
                  "model": os.path.basename(opts.model)}
        if size > SIZE_WARNING_BYTES:
            log(f"warning: --save-logits stores {n_scored} full {dtype} log-probability rows of "
                f"{eng.n_vocab} tokens per chunk: {size / 2**30:.2f} GiB for {n_chunk} chunk(s); "
                "use --chunks to make it smaller")
        writer = LogitsWriter(opts.save_logits, header, used)
    nll_all, kls = [], []
    result = PerplexityResult(opts.model, n_ctx, n_chunk, np.zeros(0))
    try:
        for c in range(n_chunk):
            chunk = used[c * n_ctx:(c + 1) * n_ctx]
            logits = eng.chunk_logits(chunk, first, min(opts.batch_size, n_ctx))
            lp = log_softmax_rows(logits)
            del logits
            targets = chunk[first + 1:]
            nll = -lp[np.arange(n_scored), targets].astype(np.float64)
            nll_all.append(nll)
            if writer is not None:
                writer.add(lp, nll)
            if ref is not None:
                kls.append(_kl_chunk(ref, c, lp, targets))
            running = math.exp(float(np.concatenate(nll_all).mean()))
            result.chunk_ppl.append(running)
            out(f"[{c + 1}]{running:.4f},")
        out("\n")
        if writer is not None:
            writer.close()
            log(f"saved the reference log-probabilities to {opts.save_logits}")
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    result.nll = np.concatenate(nll_all)
    out(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_err:.5f}\n")
    if ref is not None:
        result.kl = KlStats(*(np.concatenate([k[i] for k in kls]) for i in range(4)),
                            nll_ref=np.asarray(ref.nll[:n_chunk * n_scored], dtype=np.float64))
        out(format_kl_report(result))
    return result


def _check_reference(ref: ReferenceLogits, eng, used: np.ndarray, model: str) -> None:
    if ref.n_vocab != eng.n_vocab:
        raise BonsaiError(f"the reference {ref.path} has a vocabulary of {ref.n_vocab} tokens, "
                          f"{model} has {eng.n_vocab}: KL-divergence needs the same vocabulary; "
                          "save the reference with the F16 model of this candidate")
    if used.size > ref.n_tokens or not np.array_equal(np.asarray(ref.tokens[:used.size]), used):
        raise BonsaiError(f"the text tokenizes differently for {model} than for the reference "
                          f"{ref.path}: use the same --file (and the same tokenizer) as when the "
                          "reference was saved")


def _kl_chunk(ref: ReferenceLogits, c: int, lp: np.ndarray, targets: np.ndarray):
    ref_lp = ref.chunk_rows(c)
    p_ref = np.exp(ref_lp)
    kld = np.einsum("ij,ij->i", p_ref, ref_lp - lp, dtype=np.float64)
    idx = np.arange(lp.shape[0])
    top_ref = ref_lp.argmax(axis=1)
    same = lp.argmax(axis=1) == top_ref
    p_diff = np.exp(lp[idx, targets]).astype(np.float64) - np.exp(ref_lp[idx, targets])
    p_diff_top = np.exp(lp[idx, top_ref]).astype(np.float64) - p_ref[idx, top_ref]
    return np.maximum(kld, 0.0), p_diff, p_diff_top, same


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q))


def format_kl_report(r: PerplexityResult) -> str:
    k = r.kl
    n = r.nll.size
    lq, sq = mean_and_sigma(r.nll)
    lb, sb = mean_and_sigma(k.nll_ref)
    cov = float((r.nll * k.nll_ref).mean() - lq * lb) / (n - 1) if n > 1 else 0.0
    cor = cov / (sq * sb) if sq > 0 and sb > 0 else 0.0
    ratio_sigma = math.sqrt(max(sq * sq + sb * sb - 2 * cov, 0.0))
    ppl_q, ppl_b = math.exp(lq), math.exp(lb)
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {ppl_q:10.6f} ± {ppl_q * sq:10.6f}",
             f"Mean PPL(base)                : {ppl_b:10.6f} ± {ppl_b * sb:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {lq - lb:10.6f} ± {ratio_sigma:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {math.exp(lq - lb):10.6f} ± "
             f"{math.exp(lq - lb) * ratio_sigma:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {ppl_q - ppl_b:10.6f}",
             "", "====== KL divergence statistics ======"]
    km, ks = mean_and_sigma(k.kld)
    lines.append(f"Mean    KLD: {km:10.6f} ± {ks:10.6f}")
    lines.append(f"Maximum KLD: {k.kld.max():10.6f}")
    for q, name in ((99.9, "99.9%"), (99.0, "99.0%"), (95.0, "95.0%"), (90.0, "90.0%"),
                    (50.0, "Median"), (10.0, "10.0%"), (5.0, " 5.0%"), (1.0, " 1.0%"),
                    (0.1, " 0.1%")):
        label = f"{name:<7} KLD" if name != "Median" else "Median  KLD"
        lines.append(f"{label}: {_pct(k.kld, q):10.6f}")
    lines.append(f"Minimum KLD: {k.kld.min():10.6f}")
    lines += ["", "====== Token probability statistics ======"]
    dm, ds = mean_and_sigma(k.p_diff)
    lines.append(f"Mean    Δp: {100 * dm:6.3f} ± {100 * ds:5.3f} %")
    lines.append(f"Maximum Δp: {100 * k.p_diff.max():6.3f}%")
    for q, name in ((99.9, "99.9%"), (99.0, "99.0%"), (95.0, "95.0%"), (90.0, "90.0%"),
                    (75.0, "75.0%"), (50.0, "Median"), (25.0, "25.0%"), (10.0, "10.0%"),
                    (5.0, " 5.0%"), (1.0, " 1.0%"), (0.1, " 0.1%")):
        label = f"{name:<7} Δp" if name != "Median" else "Median  Δp"
        lines.append(f"{label}: {100 * _pct(k.p_diff, q):6.3f}%")
    lines.append(f"Minimum Δp: {100 * k.p_diff.min():6.3f}%")
    rms = math.sqrt(float((k.p_diff ** 2).mean()))
    lines.append(f"RMS Δp    : {100 * rms:6.3f} %")
    tm, _ = mean_and_sigma(k.p_diff_top)
    lines.append(f"Mean Δp of the reference's top token: {100 * tm:6.3f} %")
    st = float(k.same_top.mean())
    st_sigma = math.sqrt(st * (1 - st) / (n - 1)) if n > 1 else 0.0
    lines.append(f"Same top p: {100 * st:6.3f} ± {100 * st_sigma:5.3f} %")
    return "\n".join(lines) + "\n"
