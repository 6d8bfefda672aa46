"""Constrained-decoding benchmark (not a test): what the JSON-schema token mask costs per token and
in aggregate serving throughput, measured through the HTTP API with the official `openai` client.

1. Mask alone (in process): llguidance's mask + -inf fill + advance per token, over the model's
   vocabulary, for the schema's completion (the pure overhead the scheduler adds per constrained
   sequence and step).
2. Per-token latency (one request at a time, streamed): a JSON-schema chat request, then the same
   prompt unconstrained for the same number of tokens (ignore_eos), alternated `--repeats` times
   (medians); ms/token is the time between the first and the last text chunk over the tokens after
   the first. The scheduler's own sampling step (mask, sampler, matcher advance, text) is timed
   inside the server too: that difference is the overhead itself, free of the decode's run-to-run
   noise on a busy machine.
3. Aggregate throughput on `--parallel` slots: `--parallel` concurrent JSON-schema requests
   (different seeds), then as many unconstrained ones, request i generating exactly as many tokens
   as constrained request i did (so both batches drain alike); generated tokens / wall time of each
   batch, best of `--repeats`.

    PYTHONPATH=python python3 benchmarks/bench_constrained.py --model qwen2.5-coder-0.5b-instruct-q8_0.gguf
    PYTHONPATH=python python3 benchmarks/bench_constrained.py            # a tiny random model, written to a temp dir

`--libraries` instead compares the candidate mask libraries (llguidance, xgrammar; pip install
both) on the model's vocabulary: table build, grammar compile, mask ms/token replaying a schema
document, and which JSON-schema keywords each compiles, refuses, or accepts without enforcing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serving import LocalServer  # noqa: E402

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "color": {"enum": ["red", "green", "blue"]},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4}},
          "required": ["name", "age", "color", "hobbies"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Invent a person: a JSON object with name, age, favourite color (red, "
                                        "green or blue) and a list of hobbies."}]


def stream_chat(client, max_tokens, seed, **extra):
    """(tokens, seconds from the first to the last text chunk, text) of one streamed chat completion."""
    t_first = t_last = None
    text, usage = [], None
    for chunk in client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=max_tokens, temperature=0.7,
                                                seed=seed, stream=True, stream_options={"include_usage": True},
                                                **extra):
        if chunk.choices and chunk.choices[0].delta.content:
            t_last = time.perf_counter()
            t_first = t_first or t_last
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    return usage.completion_tokens, (t_last - t_first) if t_first else 0.0, "".join(text)


def bench_mask(engine, n_tokens_text: str) -> float:
    """ms per token of the mask alone on the engine's vocabulary, replaying `n_tokens_text`."""
    from bonsai_runner.constrained import from_response_format

    vocab = engine.scheduler.constraint_vocabulary()
    ids = [int(t) for t in engine._vocab.tokenize(n_tokens_text.encode(), add_special=False, parse_special=False)]
    row = np.zeros(vocab.n_vocab, dtype=np.float32)
    times = []
    for _ in range(3):
        m = from_response_format(RESPONSE_FORMAT).matcher(vocab)
        t0 = time.perf_counter()
        for t in ids:
            m.allowed_mask(row)
            m.advance(t)
        times.append((time.perf_counter() - t0) / len(ids))
    return 1e3 * min(times)


COVERAGE = {  # keyword -> (schema, a document it must reject, or None)
    "$ref/$defs": ({"$defs": {"p": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}},
                   '{"a":"x"}'),
    "anyOf": ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "[]"),
    "oneOf": ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "[]"),
    "allOf": ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}, "{}"),
    "pattern": ({"type": "string", "pattern": "^[a-z]+[0-9]{2}$"}, '"abc"'),
    "minLength/maxLength": ({"type": "string", "minLength": 2, "maxLength": 5}, '"abcdefg"'),
    "format date-time": ({"type": "string", "format": "date-time"}, '"yesterday"'),
    "format email": ({"type": "string", "format": "email"}, '"nobody"'),
    "minimum/maximum": ({"type": "integer", "minimum": 3, "maximum": 7}, "9"),
    "exclusiveMinimum": ({"type": "number", "exclusiveMinimum": 0}, "0"),
    "const": ({"const": "x"}, '"y"'),
    "enum (mixed types)": ({"enum": ["a", 1, None]}, "2"),
    "additionalProperties schema": ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"a":"b"}'),
    "patternProperties": ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, '{"xa":"b"}'),
    "minItems/maxItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}, "[]"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}, "[1]"),
    "uniqueItems": ({"type": "array", "uniqueItems": True}, "[1,1]"),
    "type list": ({"type": ["string", "null"]}, "1"),
    "recursive $ref": ({"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array",
                                                                          "items": {"$ref": "#/$defs/n"}}}}},
                        "$ref": "#/$defs/n"}, '{"c":[1]}'),
    "if/then": ({"if": {"type": "string"}, "then": {"minLength": 1}}, '""'),
    "minProperties": ({"type": "object", "minProperties": 1}, "{}"),
    "not": ({"not": {"type": "string"}}, '"s"'),
}


def compare_libraries(model_path: str) -> None:
    """See the module docstring (--libraries)."""
    import llguidance as llg
    import xgrammar as xgr

    from bonsai_runner import _core
    from bonsai_runner.constrained import ConstraintVocabulary

    model = _core.Model(model_path)
    eog = sorted(_core.Vocab.from_gguf(model_path).eog_ids)
    n_vocab = model.n_vocab
    t0 = time.perf_counter()
    ours = ConstraintVocabulary(model, model.metadata, n_vocab, eog)
    t_llg = time.perf_counter() - t0
    tokens = [bytes(model.token_to_piece(i)) for i in range(n_vocab)]  # xgrammar: raw pieces
    t0 = time.perf_counter()
    xinfo = xgr.TokenizerInfo(tokens, vocab_type=xgr.VocabType.RAW, vocab_size=n_vocab, stop_token_ids=eog)
    xcomp = xgr.GrammarCompiler(xinfo, max_threads=1)
    t_xgr = time.perf_counter() - t0
    print(f"vocabulary {n_vocab} tokens; token table: llguidance {t_llg:.2f} s, xgrammar {t_xgr:.2f} s")
    doc = json.dumps({"name": "Ada Lovelace", "age": 36, "color": "green",
                      "hobbies": ["mathematics", "poetry", "analytical engines"]}, separators=(",", ":"))
    ids = [int(t) for t in model.tokenize(doc.encode(), add_special=False, parse_special=False)] + [eog[0]]
    schema = json.dumps(SCHEMA)
    grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
    for name in ("llguidance", "xgrammar"):
        t0 = time.perf_counter()
        if name == "llguidance":
            m = llg.LLMatcher(ours.tokenizer, grammar, log_level=0)
            mask = lambda: m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)  # noqa: E731
            eat = m.consume_token
        else:
            m = xgr.GrammarMatcher(xcomp.compile_json_schema(schema, any_whitespace=False, separators=(",", ":")))
            xbits = xgr.allocate_token_bitmask(1, n_vocab)
            mask = lambda: m.fill_next_token_bitmask(xbits)  # noqa: E731
            eat = m.accept_token
        t_compile = time.perf_counter() - t0
        runs = []
        for rep in range(3):  # the best of 3 replays (the first compile is timed above)
            if rep:
                m.reset()
            per = []
            for t in ids:
                a = time.perf_counter()
                mask()
                per.append(time.perf_counter() - a)
                assert eat(t), (name, t)
            runs.append(np.array(per) * 1e3)
        per = min(runs, key=lambda r: r.mean())
        print(f"{name}: compile + matcher {1e3 * t_compile:.1f} ms; mask over {len(ids)} tokens: mean "
              f"{per.mean():.3f} ms, median {np.median(per):.3f} ms, max {per.max():.3f} ms")
    byte_tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]
    btok = llg.LLTokenizer(llg.TokenizerWrapper(type("T", (), {
        "eos_token_id": 256, "bos_token_id": None, "tokens": byte_tokens, "special_token_ids": [],
        "__call__": lambda self, s: list(s if isinstance(s, bytes) else s.encode())})()))
    bcomp = xgr.GrammarCompiler(xgr.TokenizerInfo(byte_tokens, vocab_type=xgr.VocabType.RAW, vocab_size=257,
                                                  stop_token_ids=[256]))
    enforced = {"llguidance": 0, "xgrammar": 0}
    for key, (sch, bad) in COVERAGE.items():
        row = []
        for name in ("llguidance", "xgrammar"):
            try:
                if name == "llguidance":
                    m = llg.LLMatcher(btok, llg.LLMatcher.grammar_from_json_schema(json.dumps(sch)), log_level=0)
                    if m.is_error():
                        raise ValueError(m.get_error())
                    eat = m.consume_token
                else:
                    m = xgr.GrammarMatcher(bcomp.compile_json_schema(json.dumps(sch)))
                    eat = m.accept_token
            except Exception as e:  # each library's own compile error
                row.append(f"refused ({str(e).splitlines()[-1][:50]})")
                continue
            accepted = all(eat(b) for b in bad.encode()) and eat(256)
            enforced[name] += not accepted
            row.append("NOT ENFORCED" if accepted else "enforced")
        print(f"  {key:28s} llguidance: {row[0]:40s} xgrammar: {row[1]}")
    print(f"enforced: llguidance {enforced['llguidance']}/{len(COVERAGE)}, "
          f"xgrammar {enforced['xgrammar']}/{len(COVERAGE)}")


def time_sampling(scheduler) -> dict:
    """Wraps the scheduler's per-sequence sampling step with a timer: {constrained?: [seconds, count]}."""
    acc = {True: [0.0, 0], False: [0.0, 0]}
    inner = scheduler._sample

    def timed(slot, row):
        key = slot.req.constraint is not None
        t0 = time.perf_counter()
        try:
            inner(slot, row)
        finally:
            acc[key][0] += time.perf_counter() - t0
            acc[key][1] += 1
    scheduler._sample = timed
    return acc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF model (default: a tiny random model)")
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--ctx-size", type=int, default=512, help="context per slot")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--libraries", action="store_true", help="compare llguidance and xgrammar (needs --model)")
    args = p.parse_args()
    if args.libraries:
        if args.model is None:
            p.error("--libraries needs --model (the vocabulary to measure on)")
        compare_libraries(os.path.expanduser(args.model))
        return 0
    tmp = None
    if args.model is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
        from test_llama_api_e2e import write_tiny_gguf

        tmp = tempfile.TemporaryDirectory()
        args.model = os.path.join(tmp.name, "tiny.gguf")
        write_tiny_gguf(args.model)
    server = LocalServer(args)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        n_vocab = server.engine.scheduler.constraint_vocabulary().n_vocab
        print(f"model {os.path.basename(args.model)}, vocabulary {n_vocab} tokens, --parallel {args.parallel}")
        stream_chat(client, 8, 0)  # warm-up (and the constrained token table)
        stream_chat(client, 8, 0, response_format=RESPONSE_FORMAT)
        acc = time_sampling(server.engine.scheduler)
        ms_c, ms_u = [], []
        for rep in range(args.repeats):
            n_c, s_c, text = stream_chat(client, args.max_tokens, 1 + rep, response_format=RESPONSE_FORMAT)
            json.loads(text)
            n_u, s_u, _ = stream_chat(client, n_c, 1 + rep, extra_body={"ignore_eos": True})
            ms_c.append(1e3 * s_c / max(n_c - 1, 1))
            ms_u.append(1e3 * s_u / max(n_u - 1, 1))
        print(f"mask alone: {bench_mask(server.engine, text):.3f} ms/token")
        mc, mu = float(np.median(ms_c)), float(np.median(ms_u))
        print(f"one request (median of {args.repeats}, {n_c} tokens in the last): JSON schema {mc:.2f} ms/token, "
              f"unconstrained {mu:.2f} ms/token: overhead {mc - mu:+.2f} ms/token ({100 * (mc / mu - 1):+.1f}%)")
        sc, su = (1e3 * acc[k][0] / max(acc[k][1], 1) for k in (True, False))
        print(f"scheduler sampling step: JSON schema {sc:.3f} ms/token, unconstrained {su:.3f} ms/token: "
              f"overhead {sc - su:+.3f} ms/token")

        def batch(lengths=None):
            def one(i):
                if lengths is None:
                    return stream_chat(client, args.max_tokens, 10 + i, response_format=RESPONSE_FORMAT)
                return stream_chat(client, lengths[i], 10 + i, extra_body={"ignore_eos": True})
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.parallel) as pool:
                res = list(pool.map(one, range(args.parallel)))
            wall = time.perf_counter() - t0
            if lengths is None:
                for _, _, t in res:
                    json.loads(t)
            return [r[0] for r in res], wall

        rate_c, rate_u = [], []
        for _ in range(args.repeats):
            lengths, wall_c = batch()
            got, wall_u = batch(lengths)
            rate_c.append(sum(lengths) / wall_c)
            rate_u.append(sum(got) / wall_u)
        rc, ru = max(rate_c), max(rate_u)
        print(f"{args.parallel} concurrent ({sum(lengths)} tokens per batch, best of {args.repeats}): JSON schema "
              f"{rc:.1f} tokens/s, unconstrained {ru:.1f} tokens/s (constrained / unconstrained {rc / ru:.3f})")
    finally:
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
