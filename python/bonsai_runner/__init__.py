"""bonsai-runner: ternary-quantized LLMs (PTQ1_0) — quantizer, GGUF converters and a C++ engine."""

__version__ = "0.1.0"

from .errors import BonsaiError  # noqa: E402,F401
