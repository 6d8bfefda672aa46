"""A strict, pure-numpy stand-in for `bonsai_runner._core` used to test the `Llama` facade's own logic
(prefix reuse, batching, streaming, stop strings, logprobs, chat) independently of the native engine.

It implements the engine's Python interface (Model / Context / Sampler) over a byte-level vocabulary
and a deterministic "model" whose logits depend on the whole token history at each position, so a
facade that mismanaged the KV cache (stale entries, gaps, wrong positions) produces different logits
than a fresh run, and the Context itself refuses non-contiguous positions. Greedy decoding follows
a fixed corpus (the logit of the corpus' next byte after the last 4 tokens is boosted), which makes
outputs predictable enough to test stop strings and multi-byte UTF-8 handling.
"""

from __future__ import annotations

import numpy as np


class BonsaiError(ValueError):
    pass


BOS, EOS, IM_START, IM_END = 256, 257, 258, 259
SPECIAL = {BOS: b"<s>", EOS: b"</s>", IM_START: b"<|im_start|>", IM_END: b"<|im_end|>"}
N_VOCAB = 260
CORPUS = list("The answer is 42.\n\nQ: what about 你好 and 🙂? Done!".encode()) + [EOS]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def reference_logits(history: list[int]) -> np.ndarray:
    """The fake model's logits after `history` (the oracle the tests compare against)."""
    h = 0
    for t in history:
        h = (h * 1000003 + t + 1) % (2 ** 61 - 1)
    out = np.random.default_rng(h).standard_normal(N_VOCAB).astype(np.float32)
    tail = history[-4:]
    nxt = CORPUS[0]
    for i in range(len(CORPUS) - len(tail)):
        if CORPUS[i:i + len(tail)] == tail:
            nxt = CORPUS[i + len(tail)]
            break
    out[nxt] += 8.0
    return out


class Model:
    def __init__(self, path, use_mmap=True, n_gpu_layers=0, tokenizer=None, verbose=False, huge_pages=True,
                 repack=True):
        self.n_vocab = N_VOCAB
        self.n_ctx_train = 128
        self.arch = "llama"
        self.bos, self.eos = BOS, EOS
        self.metadata = {"general.architecture": "llama", "llama.embedding_length": 16,
                         "tokenizer.chat_template": TEMPLATE,
                         "tokenizer.ggml.tokens": [bytes([i]).decode("latin-1") for i in range(256)]
                         + [SPECIAL[i].decode() for i in (BOS, EOS, IM_START, IM_END)]}
        self.closed = False

    def tokenize(self, text, add_special=True, parse_special=False):
        if isinstance(text, str):
            text = text.encode()
        out = [BOS] if add_special else []
        i = 0
        while i < len(text):
            for tid, s in SPECIAL.items():
                if parse_special and text.startswith(s, i):
                    out.append(tid)
                    i += len(s)
                    break
            else:
                out.append(text[i])
                i += 1
        return out

    def token_to_piece(self, token):
        return b"" if token in SPECIAL else bytes([token])

    def detokenize(self, ids):
        return b"".join(self.token_to_piece(t) for t in ids)

    def close(self):
        self.closed = True


class Context:
    def __init__(self, model, n_ctx=512, n_batch=512, n_seq_max=1, n_threads=0, type_k="f16",
                 type_v="f16", act_mode="int8", flash_attn=False, cuda_graph=True):
        self.model = model
        self.n_ctx = n_ctx if n_ctx > 0 else model.n_ctx_train
        self.n_batch = n_batch
        self.kv: list[int] = []          # tokens held by sequence 0, position = index
        self.decoded_tokens = 0          # how many tokens were computed (to observe prefix reuse)
        self.batch_sizes: list[int] = []
        self.closed = False

    def decode(self, tokens, pos=None, seq_ids=None, logits="last"):
        assert not self.closed
        tokens = list(tokens)
        pos = list(range(len(self.kv), len(self.kv) + len(tokens))) if pos is None else list(pos)
        if pos[0] != len(self.kv) or pos != list(range(pos[0], pos[0] + len(tokens))):
            raise BonsaiError(f"positions {pos[0]}.. do not continue the cache of {len(self.kv)} tokens")
        if len(tokens) > self.n_batch or len(self.kv) + len(tokens) > self.n_ctx:
            raise BonsaiError("batch too large or context full")
        rows = []
        for t in tokens:
            self.kv.append(t)
            rows.append(reference_logits(self.kv))
        self.decoded_tokens += len(tokens)
        self.batch_sizes.append(len(tokens))
        rows = np.stack(rows)
        return rows if logits == "all" else rows[-1:]

    def seq_rm(self, seq, p0, p1):
        assert seq == 0 and (p1 == -1 or p1 < 0)
        del self.kv[p0:]

    def seq_reusable(self, seq, n):  # attention-only: any prefix is kept exactly
        return n

    def clear(self):
        self.kv.clear()

    def close(self):
        self.closed = True


class Sampler:
    def __init__(self, temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                 repeat_last_n=64, seed=0, frequency_penalty=0.0, presence_penalty=0.0, logit_bias=None):
        self.temp = temp
        self.rng = np.random.default_rng(seed)
        self.accepted: list[int] = []
        self.repeat_last_n = repeat_last_n
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty
        self.logit_bias = dict(logit_bias or {})

    def sample(self, row):
        row = np.asarray(row, dtype=np.float64).copy()
        for t, b in self.logit_bias.items():
            row[t] = -np.inf if b <= -100 else row[t] + b
        window = self.accepted if self.repeat_last_n < 0 else self.accepted[len(self.accepted) - self.repeat_last_n:]
        if self.repeat_last_n != 0:
            for t in set(window):
                row[t] -= window.count(t) * self.frequency_penalty + self.presence_penalty
        if self.temp <= 0:
            return int(np.argmax(row))
        p = np.exp((row - row.max()) / self.temp)
        return int(self.rng.choice(len(row), p=p / p.sum()))

    def accept(self, token):
        self.accepted.append(token)

    def reset(self):
        self.accepted.clear()
