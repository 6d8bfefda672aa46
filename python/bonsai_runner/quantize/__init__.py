"""The PTQ1_0 quantizer: calibrated, layer-by-layer ternary quantization of Hugging Face checkpoints.

Modules: calibration (text -> token sequences), hf_layers (transformers' own decoder layers,
one at a time, on the torch device), ternary_fit (exact weighted ternary fit), gptq
(error-feedback quantization of one layer, scale refit), refine (Adam on log-scales against the
block output, through autograd), sensitivity (cosine / relative error / held-out loss), policy
(types per tensor, --target-bpw), pipeline (the driver). The compute is torch, imported with the pipeline
only (policy and calibration, which `bonsai plan` and the tiny-model fixture use, need no torch).
"""


def __getattr__(name):
    if name in ("QuantizeOptions", "quantize_model"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["QuantizeOptions", "quantize_model"]
