"""The `bonsai.*` GGUF metadata: quantization scheme, fallback layer table, sensitivity scores.

Keys (all written by files that hold ternary tensors):
    bonsai.format_version            u32     1
    bonsai.quant.scheme              string  tier of the bulk of the linear weights ("ptq1_0", ...)
    bonsai.quant.group_size          u32     weights per scale of that scheme (128 for PTQ1_0)
    bonsai.quant.activation_mode     string  "int8_per_token" (W1.58A8) or "float"
    bonsai.quant.calibration         string  JSON object summarizing the calibration set (optional)
    bonsai.quant.sensitivity         string  JSON object {gguf tensor: {cosine, rel_err, loss_delta}}
    bonsai.fallback_table            string  JSON list of {tensor, type, reason, cosine?, rel_err?,
                                             loss_delta?}: tensors kept above the scheme, and why
Tensor names are the GGUF (llama.cpp) names, types the GGUF type names ("Q8_0").
"""

from __future__ import annotations

import json

from ..ggml_types import type_info
from .arch.base import STR, U32, MetaKV

FORMAT_VERSION = 1
METRICS = ("cosine", "rel_err", "loss_delta")


def fallback_entry(tensor: str, type_name: str, reason: str, metrics: dict | None = None) -> dict:
    e = {"tensor": tensor, "type": type_info(type_name).name, "reason": reason}
    for k in METRICS:
        if metrics and metrics.get(k) is not None:
            e[k] = float(metrics[k])
    return e


def bonsai_metadata(scheme: str, group_size: int, activation_mode: str,
                    fallback_table: list[dict], sensitivity: dict[str, dict],
                    calibration: dict | None = None) -> list[MetaKV]:
    kv = [MetaKV("bonsai.format_version", FORMAT_VERSION, U32),
          MetaKV("bonsai.quant.scheme", scheme, STR),
          MetaKV("bonsai.quant.group_size", int(group_size), U32),
          MetaKV("bonsai.quant.activation_mode", activation_mode, STR)]
    if calibration:
        kv.append(MetaKV("bonsai.quant.calibration", json.dumps(calibration, sort_keys=True), STR))
    kv.append(MetaKV("bonsai.quant.sensitivity", json.dumps(sensitivity, sort_keys=True), STR))
    kv.append(MetaKV("bonsai.fallback_table", json.dumps(fallback_table), STR))
    return kv
