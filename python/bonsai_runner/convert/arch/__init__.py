"""Model families the converters know, registered by Hugging Face architecture name.

One module per family (llama.py, qwen2.py, qwen3.py, qwen35.py); each decorates its class with
`@register("XxxForCausalLM", ...)`. `family_for(config)` picks the class named by config.json's
"architectures" and instantiates it (which validates the hyperparameters).
"""

from __future__ import annotations

from ...errors import BonsaiError

_REGISTRY: dict[str, type] = {}


def register(*hf_names: str):
    def deco(cls):
        cls.hf_architectures = tuple(hf_names)
        for n in hf_names:
            _REGISTRY[n] = cls
        return cls
    return deco


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def family_for(config: dict, where: str = "config.json"):
    arches = config.get("architectures")
    if not (isinstance(arches, list) and arches and isinstance(arches[0], str)):
        raise BonsaiError(f"{where}: no \"architectures\" list naming the model class; supported: "
                          f"{', '.join(supported_architectures())}")
    cls = _REGISTRY.get(arches[0])
    if cls is None:
        raise BonsaiError(f"{where}: unsupported architecture {arches[0]!r}; supported: "
                          f"{', '.join(supported_architectures())}")
    return cls(config)


def family_for_gguf_arch(arch: str):
    """The family class whose GGUF architecture name is `arch` (None when unknown)."""
    for cls in _REGISTRY.values():
        if cls.gguf_arch == arch:
            return cls
    return None


from . import llama, qwen2, qwen3, qwen35  # noqa: E402,F401  (registers the families)
