"""The PTQ1_0 quantizer: calibrated, layer-by-layer ternary quantization of Hugging Face checkpoints.

Modules: calibration (text -> token sequences), block_forward (numpy forward of one decoder
block), ternary_fit (exact weighted ternary fit), gptq (error-feedback quantization of one layer,
scale refit), refine (Adam on log-scales against the block output), sensitivity (cosine /
relative error / held-out loss), policy (types per tensor, --target-bpw), pipeline (the driver).
"""

from .pipeline import QuantizeOptions, quantize_model

__all__ = ["QuantizeOptions", "quantize_model"]
