"""bonsai-runner: ternary-quantized LLMs (PTQ1_0) — quantizer, GGUF converters and a C++ engine."""

__version__ = "0.1.0"

from .errors import BonsaiError  # noqa: E402,F401


def __getattr__(name):
    # `Llama` is imported on first use, so `import bonsai_runner` stays light (no numpy, no jinja2).
    if name in ("Llama", "LlamaState"):
        from . import llama

        return getattr(llama, name)
    raise AttributeError(f"module 'bonsai_runner' has no attribute {name!r}")
