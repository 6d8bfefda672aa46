"""`bonsai eval-prompts`: a fixed prompt suite run on several models, side by side.

The suite (data/prompts.json: code, Chinese Q&A, summary, math reasoning, instruction following)
is rendered with each model's own chat template and answered greedily (temperature 0, a fixed
seed, the same max_tokens per prompt), one model at a time so only one is in memory. The report is
Markdown — per prompt a heading, the prompt, then one section per model with its answer, its token
count and speed — and optionally the same content as a standalone HTML page with the answers in
columns. Greedy decoding makes the run reproducible: two runs of the same file give the same text.
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Optional

from ..errors import BonsaiError


def default_suite_file() -> str:
    return str(resources.files("bonsai_runner") / "data" / "prompts.json")


def load_suite(path: Optional[str] = None) -> list[dict]:
    path = path or default_suite_file()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BonsaiError(f"prompt suite not found: {path}") from None
    except ValueError as e:
        raise BonsaiError(f"prompt suite {path} is not valid JSON: {e}") from None
    prompts = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(prompts, list) or not prompts:
        raise BonsaiError(f"prompt suite {path}: expected an object with a non-empty 'prompts' list")
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or not isinstance(p.get("messages"), list) or "id" not in p:
            raise BonsaiError(f"prompt suite {path}: prompt #{i} needs 'id' and 'messages'")
    return prompts


@dataclass
class Answer:
    text: str
    n_tokens: int
    seconds: float
    finish_reason: str


def answer_suite(model: str, prompts: list[dict], seed: int = 0, n_ctx: int = 2048,
                 threads: Optional[int] = None, log: Callable[[str], None] = print) -> list[Answer]:
    from ..llama import Llama

    if not Path(model).is_file():
        raise BonsaiError(f"model file not found: {model}")
    out = []
    with Llama(model, n_ctx=n_ctx, n_threads=threads, seed=seed, verbose=False) as llm:
        for p in prompts:
            t0 = time.perf_counter()
            r = llm.create_chat_completion(p["messages"], temperature=0.0, seed=seed,
                                           max_tokens=int(p.get("max_tokens", 128)))
            dt = time.perf_counter() - t0
            ch = r["choices"][0]
            out.append(Answer(ch["message"]["content"] or "", int(r["usage"]["completion_tokens"]),
                              dt, str(ch.get("finish_reason"))))
            log(f"{os.path.basename(model)}: {p['id']} ({out[-1].n_tokens} tokens, {dt:.1f} s)")
    return out


def _prompt_text(p: dict) -> str:
    return "\n\n".join(f"[{m.get('role')}] {m.get('content')}" for m in p["messages"])


def _fence(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}text\n{text.rstrip()}\n{fence}"


def format_markdown(models: list[str], prompts: list[dict], answers: list[list[Answer]],
                    seed: int) -> str:
    names = [os.path.basename(m) for m in models]
    lines = ["# bonsai eval-prompts", "",
             f"{len(prompts)} prompts, greedy decoding (temperature 0, seed {seed}), each model "
             "with its own chat template.", "", "| model | file | tokens | seconds |",
             "|---|---|---|---|"]
    for name, path, ans in zip(names, models, answers):
        lines.append(f"| {name} | `{path}` | {sum(a.n_tokens for a in ans)} | "
                     f"{sum(a.seconds for a in ans):.1f} |")
    for i, p in enumerate(prompts):
        lines += ["", f"## {i + 1}. {p['id']} ({p.get('category', '')})", "", "**Prompt**", "",
                  _fence(_prompt_text(p))]
        for name, ans in zip(names, answers):
            a = ans[i]
            lines += ["", f"**{name}** — {a.n_tokens} tokens, {a.seconds:.1f} s, "
                      f"finish: {a.finish_reason}", "", _fence(a.text)]
    return "\n".join(lines) + "\n"


def format_html(models: list[str], prompts: list[dict], answers: list[list[Answer]],
                seed: int) -> str:
    names = [html.escape(os.path.basename(m)) for m in models]
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\"><title>bonsai eval-prompts"
             "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
             "width:100%}td,th{border:1px solid #ccc;padding:.5em;vertical-align:top}"
             "pre{white-space:pre-wrap;margin:0}</style></head><body>",
             f"<h1>bonsai eval-prompts</h1><p>{len(prompts)} prompts, greedy decoding (temperature "
             f"0, seed {seed}).</p>"]
    for i, p in enumerate(prompts):
        parts.append(f"<h2>{i + 1}. {e(p['id'])} ({e(p.get('category', ''))})</h2>"
                     f"<pre>{e(_prompt_text(p))}</pre><table><tr>"
                     + "".join(f"<th>{n}</th>" for n in names) + "</tr><tr>")
        for ans in answers:
            a = ans[i]
            parts.append(f"<td><pre>{e(a.text)}</pre><p><small>{a.n_tokens} tokens, "
                         f"{a.seconds:.1f} s, finish: {e(a.finish_reason)}</small></p></td>")
        parts.append("</tr></table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_eval_prompts(models: list[str], out: Optional[str] = None, write_html: bool = False,
                     suite: Optional[str] = None, seed: int = 0, n_ctx: int = 2048,
                     threads: Optional[int] = None,
                     log: Callable[[str], None] | None = None) -> str:
    """Answers the suite with every model; writes the Markdown report to `out` (and `out` with
    .html when write_html) or returns it for printing. Returns the Markdown text."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    if not models:
        raise BonsaiError("give at least one model with --models")
    for m in models:
        if not Path(m).is_file():
            raise BonsaiError(f"model file not found: {m}")
    if write_html and not out:
        raise BonsaiError("--html needs --out (the HTML report is written next to it)")
    if out and not Path(out).resolve().parent.is_dir():
        raise BonsaiError(f"--out {out}: the directory does not exist")
    prompts = load_suite(suite)
    answers = [answer_suite(m, prompts, seed, n_ctx, threads, log) for m in models]
    md = format_markdown(models, prompts, answers, seed)
    if out:
        _write_atomic(Path(out), md)
        log(f"wrote {out}")
        if write_html:
            h = Path(out).with_suffix(".html")
            _write_atomic(h, format_html(models, prompts, answers, seed))
            log(f"wrote {h}")
    return md
