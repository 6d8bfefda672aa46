"""`bonsai compare`: a quantized candidate against its F16 reference, with the quality gates.

Both models run the same chunks of the same text (perplexity.py): the reference first, its full
log-probabilities saved to a temporary reference file, then the candidate in KL mode. Gates
(SPEC §8), either one failing means "widen the fallback table":
- PPL ratio: PPL(candidate) / PPL(reference) > max_ppl_ratio (default 1.5);
- degradation: the share of scored positions whose most likely token differs from the
  reference's (100% - same-top %) > max_degradation (default 40%).
The PPL ratio compares averages; the top-token disagreement catches a model whose average loss
looks fine while its greedy output has drifted.

Which tensors to promote comes from the candidate's own metadata (convert/bonsai_meta.py):
`bonsai.quant.sensitivity` {tensor: {cosine, rel_err, loss_delta}} ranks the tensors still stored
at a low-bit tier (those already in `bonsai.fallback_table` or at Q8_0 and above are skipped):
lowest output cosine first, ties by the highest held-out loss increase of their block.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..errors import BonsaiError
from .perplexity import PerplexityOptions, PerplexityResult, run_perplexity

LOW_BIT_TYPES = {"PTQ1_0", "PQ2_0", "TQ1_0", "TQ2_0", "Q2_0", "Q4_0"}


@dataclass
class CompareResult:
    reference: PerplexityResult
    candidate: PerplexityResult
    ppl_ratio: float
    mean_kl: float
    same_top: float
    degradation: float
    failures: list = field(default_factory=list)
    promote: list = field(default_factory=list)     # [{tensor, type, cosine, rel_err, loss_delta}]
    promote_note: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures


def promotion_candidates(path: str) -> tuple[list[dict], str]:
    """Low-bit tensors of `path` ranked for promotion, and a note when none can be ranked."""
    from ..gguf_reader import open_gguf

    with open_gguf(path) as r:
        md = r.metadata
        types = {t.name: t.type_name for t in r.tensors}
    raw = md.get("bonsai.quant.sensitivity")
    if not raw:
        return [], ("the candidate has no bonsai.quant.sensitivity metadata: quantize it with "
                    "--sensitivity-analysis to rank the tensors to promote")
    try:
        sens = json.loads(raw)
        fallback = {e["tensor"] for e in json.loads(md.get("bonsai.fallback_table") or "[]")}
    except (ValueError, KeyError, TypeError) as e:
        raise BonsaiError(f"{path}: the bonsai.quant.sensitivity / bonsai.fallback_table "
                          f"metadata is not valid JSON ({e}); convert the model again") from None
    rows = []
    for name, m in sens.items():
        t = types.get(name)
        if t is None or t not in LOW_BIT_TYPES or name in fallback or not isinstance(m, dict):
            continue
        rows.append({"tensor": name, "type": t, "cosine": m.get("cosine"),
                     "rel_err": m.get("rel_err"), "loss_delta": m.get("loss_delta")})

    def key(e):
        cos = e["cosine"] if e["cosine"] is not None else 1.0
        loss = e["loss_delta"] if e["loss_delta"] is not None else 0.0
        return (cos, -loss, e["tensor"])

    rows.sort(key=key)
    note = "" if rows else "every tensor with sensitivity scores is already above the low-bit tiers"
    return rows, note


def run_compare(reference: str, candidate: str, file: Optional[str] = None,
                ctx_size: Optional[int] = None, chunks: int = -1, batch_size: int = 512,
                threads: int = 0, act_mode: str = "int8", max_ppl_ratio: float = 1.5,
                max_degradation: float = 0.40,
                out: Callable[[str], None] | None = None,
                log: Callable[[str], None] | None = None) -> CompareResult:
    out = out or (lambda s: print(s, end="", flush=True))
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    for what, p in (("--reference", reference), ("--candidate", candidate)):
        if not Path(p).is_file():
            raise BonsaiError(f"{what} model file not found: {p}")
    promote, note = promotion_candidates(candidate)
    with tempfile.TemporaryDirectory(prefix="bonsai-compare-") as tmp:
        ref_file = str(Path(tmp) / "reference.logits")
        out(f"reference: {reference}\n")
        ref = run_perplexity(PerplexityOptions(
            model=reference, file=file, ctx_size=ctx_size, chunks=chunks, batch_size=batch_size,
            threads=threads, act_mode=act_mode, save_logits=ref_file), out, log)
        out(f"candidate: {candidate}\n")
        cand = run_perplexity(PerplexityOptions(
            model=candidate, file=file, ctx_size=ref.n_ctx, chunks=ref.n_chunks,
            batch_size=batch_size, threads=threads, act_mode=act_mode,
            kl_divergence=ref_file), out, log)
    same = float(cand.kl.same_top.mean())
    res = CompareResult(ref, cand, cand.ppl / ref.ppl, float(cand.kl.kld.mean()), same, 1.0 - same,
                        promote=promote, promote_note=note)
    if res.ppl_ratio > max_ppl_ratio:
        res.failures.append(f"PPL ratio {res.ppl_ratio:.4f} > {max_ppl_ratio}")
    if res.degradation > max_degradation:
        res.failures.append(f"degradation (top token differs from the reference) "
                            f"{100 * res.degradation:.1f}% > {100 * max_degradation:.0f}%")
    out(format_verdict(res))
    return res


def format_verdict(r: CompareResult, n_promote: int = 10) -> str:
    lines = ["", "====== bonsai compare ======",
             f"PPL reference : {r.reference.ppl:.4f} +/- {r.reference.ppl_err:.4f}",
             f"PPL candidate : {r.candidate.ppl:.4f} +/- {r.candidate.ppl_err:.4f}",
             f"PPL ratio     : {r.ppl_ratio:.4f}",
             f"mean KL       : {r.mean_kl:.6f}",
             f"same top token: {100 * r.same_top:.2f}% (degradation {100 * r.degradation:.2f}%)"]
    if r.passed:
        lines.append("verdict: PASS")
    else:
        lines.append("verdict: FAIL (" + "; ".join(r.failures) + "): widen the fallback table")
        if r.promote:
            lines.append(f"tensors to promote (lowest cosine / highest loss increase first, "
                         f"{min(n_promote, len(r.promote))} of {len(r.promote)}):")
            for e in r.promote[:n_promote]:
                def f(v):
                    return f"{v:.4f}" if v is not None else "-"
                lines.append(f"  {e['tensor']:<36} {e['type']:<7} cosine {f(e['cosine'])}  "
                             f"rel_err {f(e['rel_err'])}  loss_delta {f(e['loss_delta'])}")
            lines.append("re-quantize with these at Q8_0 (--policy) or a higher --threshold / "
                         "--target-bpw (on Qwen2.5-Coder-0.5B, the quantizer's defaults and 12 x "
                         "256 calibration tokens: --target-bpw 4 gave PPL ratio 1.13, 4.57 gave 1.03)")
        else:
            lines.append(r.promote_note)
    return "\n".join(lines) + "\n"
