"""The response dictionaries of the completion API, in llama-cpp-python's (OpenAI-compatible) shapes.

Text completion: `{id "cmpl-<uuid>", object "text_completion", created, model, choices: [{text,
index, logprobs, finish_reason}], usage}`; a stream yields the same dict without `usage`, with
`finish_reason` None on every chunk but the last, which carries empty text and the reason.
Chat completion: id "chat" + the completion id, object "chat.completion" with a `message`, or
"chat.completion.chunk" whose first delta is {role}, then {content} deltas, then {} with the reason.

Logprobs follow the legacy completions shape (`tokens`, `text_offset`, `token_logprobs`,
`top_logprobs`), converted for chat to `{"content": [{token, bytes, logprob, top_logprobs}],
"refusal": None}`. A token's log-probability comes from the logits row of the position before it.
"""

from __future__ import annotations

import codecs
import time
import uuid
from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["log_softmax", "build_logprobs", "completion_chunk", "completion_response",
           "chat_response", "chat_chunks", "new_completion_id"]


def new_completion_id() -> tuple[str, int]:
    return f"cmpl-{uuid.uuid4()}", int(time.time())


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = np.asarray(row, dtype=np.float64)
    m = np.max(row)
    if not np.isfinite(m):
        m = 0.0
    shifted = row - m
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted)))


def build_logprobs(tokens: Sequence[int], rows: Sequence[Optional[np.ndarray]], top_k: int,
                   piece: Callable[[int], bytes], text_offset: int) -> dict:
    """Legacy completion logprobs for `tokens`; rows[i] is the logits row that predicted tokens[i]
    (None for a token nothing predicted: the first token of an echoed prompt)."""
    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
    offset = text_offset
    for tok, row in zip(tokens, rows):
        b = piece(tok)
        s = b.decode("utf-8", errors="ignore")
        out["tokens"].append(s)
        out["text_offset"].append(offset)
        offset += len(decoder.decode(b))
        if row is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        lp = log_softmax(row)
        out["token_logprobs"].append(float(lp[tok]))
        top: dict[str, float] = {}
        k = min(int(top_k), lp.shape[0])
        if k > 0:
            idx = np.argpartition(-lp, k - 1)[:k]
            for i in idx[np.argsort(-lp[idx], kind="stable")]:
                top[piece(int(i)).decode("utf-8", errors="ignore")] = float(lp[i])
        top[s] = float(lp[tok])
        out["top_logprobs"].append(top)
    return out


def completion_chunk(cid: str, created: int, model: str, text: str, logprobs: Optional[dict],
                     finish_reason: Optional[str]) -> dict:
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def completion_response(cid: str, created: int, model: str, text: str, logprobs: Optional[dict],
                        finish_reason: str, n_prompt: int, n_completion: int) -> dict:
    r = completion_chunk(cid, created, model, text, logprobs, finish_reason)
    r["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                  "total_tokens": n_prompt + n_completion}
    return r


def _chat_logprobs(lp: Optional[dict]) -> Optional[dict]:
    if lp is None:
        return None
    content = []
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        content.append({"token": tok, "bytes": None, "logprob": logprob,
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": None}
                                         for t, v in (top or {}).items()]})
    return {"content": content, "refusal": None}


def chat_response(completion: dict) -> dict:
    choice = completion["choices"][0]
    return {"id": "chat" + completion["id"], "object": "chat.completion",
            "created": completion["created"], "model": completion["model"],
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": choice["text"]},
                         "logprobs": _chat_logprobs(choice["logprobs"]),
                         "finish_reason": choice["finish_reason"]}],
            "usage": completion["usage"]}


def chat_chunks(chunks):
    """Converts a stream of text-completion chunks into chat-completion chunks."""
    first = True
    for chunk in chunks:
        head = {"id": "chat" + chunk["id"], "model": chunk["model"], "created": chunk["created"],
                "object": "chat.completion.chunk"}
        choice = chunk["choices"][0]
        if first:
            first = False
            yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                        "logprobs": None, "finish_reason": None}]}
        done = choice["finish_reason"] is not None
        yield {**head, "choices": [{"index": 0,
                                    "delta": {} if done else {"content": choice["text"]},
                                    "logprobs": _chat_logprobs(choice["logprobs"]),
                                    "finish_reason": choice["finish_reason"]}]}
