"""The saved reference run of `bonsai perplexity --save-logits` (read by `--kl-divergence`).

KL(P_ref || P_model) needs the reference's whole distribution at every scored position, so the file
keeps the full log-probabilities of the scored positions (the second half of each chunk, as in
llama-perplexity) — not the raw logits of every position, which would be twice as large and hold
nothing KL uses. Row precision is chosen by size:
- float32 when the rows take at most 64 MiB (tiny and small vocabularies: exact);
- float16 otherwise. A float16 log-probability near 0 (the tokens that carry the mass) is exact to
  ~5e-4 relative; large negative values (≈ -20) are off by up to ~0.01 nats, but they are weighted
  by p ≈ 2e-9, so the KL error stays far below the differences being measured. The reader
  renormalizes every row (subtracts its logsumexp), so rounding never makes p sum to more than 1.
A top-k format would be smaller but only gives a lower bound of the KL; the full rows keep it exact.
At Qwen2.5's 151,936 tokens that is 297 KiB per scored position (≈ 76 MiB per 512-token chunk),
hence the size warning in perplexity.py.

Layout (little-endian):
    magic      8 bytes  b"BNSLOGP1"
    hdr_len    u64      length of the JSON header
    header     JSON     {n_vocab, n_ctx, n_chunks, first, n_tokens, dtype, model, add_bos}
    padding    zeros up to a multiple of 64 bytes
    tokens     int32[n_tokens]            the evaluated tokens (n_chunks * n_ctx), BOS as fed
    nll        float64[n_scored]          the reference's negative log-likelihood per scored token
    logprobs   dtype[n_scored, n_vocab]   log-softmax rows of the scored positions
with n_scored = n_chunks * (n_ctx - 1 - first). Written under a temporary name and renamed when
complete; read through a memory map (the rows are never loaded whole).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import BonsaiError

MAGIC = b"BNSLOGP1"
ALIGN = 64
FLOAT32_LIMIT = 64 << 20


def choose_dtype(n_rows: int, n_vocab: int) -> str:
    return "float32" if n_rows * n_vocab * 4 <= FLOAT32_LIMIT else "float16"


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class LogitsWriter:
    """Streams a reference run to `path`: header and tokens first, then chunk by chunk."""

    def __init__(self, path: str | os.PathLike, header: dict, tokens: np.ndarray):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.header = dict(header)
        self.dtype = np.dtype(header["dtype"])
        self.n_rows = header["n_chunks"] * (header["n_ctx"] - 1 - header["first"])
        self._nll = []
        self._rows_written = 0
        if self.path.parent and not self.path.parent.is_dir():
            raise BonsaiError(f"--save-logits {path}: the directory {self.path.parent} does not exist")
        hdr = json.dumps(self.header, sort_keys=True).encode()
        self._f = open(self.tmp, "wb")
        self._f.write(MAGIC + struct.pack("<Q", len(hdr)) + hdr)
        self._f.write(b"\0" * (_aligned(self._f.tell()) - self._f.tell()))
        self._f.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        self._f.write(b"\0" * (_aligned(self._f.tell()) - self._f.tell()))
        # The nll block comes before the rows: reserve it and fill it in at close().
        self._nll_at = self._f.tell()
        self._f.write(b"\0" * _aligned(8 * self.n_rows))
        self._rows_at = self._f.tell()

    def add(self, logprobs: np.ndarray, nll: np.ndarray) -> None:
        self._f.write(np.ascontiguousarray(logprobs, dtype=self.dtype.newbyteorder("<")).tobytes())
        self._nll.append(np.asarray(nll, dtype=np.float64))
        self._rows_written += logprobs.shape[0]

    def close(self) -> None:
        if self._rows_written != self.n_rows:
            self.abort()
            raise BonsaiError(f"internal: {self._rows_written} rows written, {self.n_rows} expected")
        self._f.seek(self._nll_at)
        self._f.write(np.concatenate(self._nll).astype("<f8").tobytes())
        self._f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self.tmp.unlink(missing_ok=True)


class ReferenceLogits:
    """A saved reference run, memory-mapped."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise BonsaiError(f"reference logits file not found: {path} (make it with "
                              "`bonsai perplexity --model F16.gguf --save-logits FILE`)")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise BonsaiError(f"{path} is not a reference logits file of `bonsai perplexity "
                                  "--save-logits` (bad magic); make one with --save-logits")
            (n,) = struct.unpack("<Q", head[8:])
            try:
                self.header = json.loads(f.read(n))
                h = self.header
                self.n_vocab, self.n_ctx, self.n_chunks = h["n_vocab"], h["n_ctx"], h["n_chunks"]
                self.first, self.n_tokens = h["first"], h["n_tokens"]
                dtype = np.dtype(h["dtype"]).newbyteorder("<")
            except (ValueError, KeyError, TypeError) as e:
                raise BonsaiError(f"{path}: corrupt header ({e}); make the file again with "
                                  "--save-logits") from None
        self.n_scored_per_chunk = self.n_ctx - 1 - self.first
        self.n_rows = self.n_chunks * self.n_scored_per_chunk
        tok_at = _aligned(16 + n)
        nll_at = _aligned(tok_at + 4 * self.n_tokens)
        rows_at = nll_at + _aligned(8 * self.n_rows)
        need = rows_at + self.n_rows * self.n_vocab * dtype.itemsize
        if size != need:
            raise BonsaiError(f"{path}: {size} bytes, the header describes {need}: the file is "
                              "truncated or corrupt; make it again with --save-logits")
        self.tokens = np.memmap(self.path, "<i4", "r", tok_at, (self.n_tokens,))
        self.nll = np.memmap(self.path, "<f8", "r", nll_at, (self.n_rows,))
        self.logprobs = np.memmap(self.path, dtype, "r", rows_at, (self.n_rows, self.n_vocab))

    def chunk_rows(self, chunk: int) -> np.ndarray:
        """The renormalized float32 log-probability rows of one chunk's scored positions."""
        a = chunk * self.n_scored_per_chunk
        rows = np.asarray(self.logprobs[a:a + self.n_scored_per_chunk], dtype=np.float32)
        m = rows.max(axis=1, keepdims=True)
        lse = m + np.log(np.exp(rows - m, dtype=np.float64).sum(axis=1, keepdims=True))
        return (rows - lse).astype(np.float32)

    def close(self) -> None:
        """Drops the maps (the file closes when no row view is left)."""
        self.tokens = self.nll = self.logprobs = None
