"""What lets code written for llama-cpp-python 0.3.x run on `bonsai_runner.Llama` unchanged.

llama-cpp-python's keywords are all accepted. Those `Llama` honours are its own parameters; the
others are listed in INIT_KEYWORDS / SAMPLING_KEYWORDS with their llama-cpp-python default and a
policy for any other value:
- "warn": the value cannot be applied here but does not change the results (memory locking, NUMA,
  device placement, thread counts of a second pool): accepted with one warning naming it and why;
- "refuse": the value would change the results and cannot be applied (LoRA adapters, metadata
  overrides, a draft model, mirostat...): a BonsaiError (a ValueError) naming it and why.
A keyword that is not llama-cpp-python's nor ours is a TypeError with the closest known name.

Also here: the GGML type ids llama-cpp-python passes as type_k / type_v, `LlamaState` (what
save_state returns) and the Hugging Face Hub download behind `Llama.from_pretrained`.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from .engine_limits import check_float
from .errors import BonsaiError

__all__ = ["INIT_KEYWORDS", "SAMPLING_KEYWORDS", "LlamaState", "cache_type_name", "check_compat_keywords",
           "check_rope", "reject_unknown_keywords", "hub_download", "model_identity"]

# name -> (llama-cpp-python's default, policy for another value, why)
INIT_KEYWORDS: dict[str, tuple[Any, str, str]] = {
    "split_mode": (1, "warn", "bonsai runs on one device (the layer split is the only mode)"),
    "main_gpu": (0, "warn", "bonsai uses the first visible CUDA device; pick one with CUDA_VISIBLE_DEVICES"),
    "tensor_split": (None, "warn", "bonsai runs on one device, so there is nothing to split"),
    "rpc_servers": (None, "warn", "bonsai has no RPC backend; the model runs on this machine"),
    "vocab_only": (False, "warn", "bonsai loads the whole model (memory-mapped); tokenizing is the same"),
    "use_mlock": (False, "warn", "bonsai does not lock the model in RAM"),
    "n_ubatch": (512, "warn", "bonsai splits work by n_batch only"),
    "yarn_ext_factor": (-1.0, "warn", "bonsai applies no YaRN scaling (the YaRN settings have no effect)"),
    "yarn_attn_factor": (1.0, "warn", "bonsai applies no YaRN scaling (the YaRN settings have no effect)"),
    "yarn_beta_fast": (32.0, "warn", "bonsai applies no YaRN scaling (the YaRN settings have no effect)"),
    "yarn_beta_slow": (1.0, "warn", "bonsai applies no YaRN scaling (the YaRN settings have no effect)"),
    "yarn_orig_ctx": (0, "warn", "bonsai applies no YaRN scaling (the YaRN settings have no effect)"),
    "offload_kqv": (True, "warn", "the KV cache lives with its layer (GPU layers keep it on the GPU)"),
    "op_offload": (None, "warn", "bonsai places each layer's work with its weights"),
    "swa_full": (None, "warn", "bonsai keeps a full-size cache for every attention layer"),
    "lora_scale": (1.0, "warn", "no LoRA adapter is loaded (bonsai does not apply adapters)"),
    "numa": (False, "warn", "bonsai has no NUMA placement"),
    "kv_overrides": (None, "refuse", "bonsai cannot override the model file's metadata; edit the file "
                                     "(gguf-py's gguf_set_metadata) instead"),
    "rope_scaling_type": (-1, "refuse", "bonsai uses the rope scaling stored in the model file"),
    "lora_base": (None, "refuse", "bonsai does not apply LoRA adapters; merge the adapter into the model first"),
    "lora_path": (None, "refuse", "bonsai does not apply LoRA adapters; merge the adapter into the model first"),
    "chat_handler": (None, "refuse", "llama-cpp-python's chat handlers drive its own internals; use "
                                     "chat_format= or chat_template= instead"),
    "draft_model": (None, "refuse", "bonsai has no speculative decoding"),
}

# Sampling and completion keywords of create_completion / create_chat_completion / generate.
SAMPLING_KEYWORDS: dict[str, tuple[Any, str, str]] = {
    "typical_p": (1.0, "refuse", "locally typical sampling is not implemented"),
    "tfs_z": (1.0, "refuse", "tail-free sampling is not implemented"),
    "mirostat_mode": (0, "refuse", "mirostat sampling is not implemented"),
    "mirostat_tau": (5.0, "warn", "it is used only by mirostat, which is off"),
    "mirostat_eta": (0.1, "warn", "it is used only by mirostat, which is off"),
    "penalize_nl": (True, "refuse", "the penalties always apply to the newline token too"),
    # grammar / response_format are honoured by create_completion / create_chat_completion (constrained.py);
    # generate() and sample() check them here
    "grammar": (None, "refuse", "grammars apply in create_completion / create_chat_completion only, not in "
                                "generate() or sample()"),
    "functions": (None, "refuse", "legacy function calling is not supported; use tools="),
    "function_call": (None, "refuse", "legacy function calling is not supported; use tools="),
    "tool_choice": (None, "refuse", "tools and tool_choice apply in create_chat_completion only"),
}

_DEFAULT_SAME = {"tool_choice": ("auto",), "response_format": ({"type": "text"},), "kv_overrides": ({},)}

_FLT_MAX = float(np.finfo(np.float32).max)

# llama.cpp's GGML_TYPE ids of the KV cache types bonsai stores.
_GGML_CACHE_TYPES = {1: "f16", 8: "q8_0"}


def _is_default(name: str, value: Any, default: Any) -> bool:
    if value is default or value in _DEFAULT_SAME.get(name, ()):
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return type(value) is type(default) and value == default
    if isinstance(default, (int, float)) and isinstance(value, (int, float, np.integer, np.floating)):
        return float(value) == float(default)
    return default is None and value is None


def check_compat_keywords(table: Mapping[str, tuple[Any, str, str]], given: Mapping[str, Any],
                          where: str, stacklevel: int = 3) -> None:
    """Applies the policy of `table` to the keywords in `given` (all of them names in the table);
    a warning points `stacklevel` frames up (the caller's caller: the user's line)."""
    for name, value in given.items():
        default, policy, why = table[name]
        if _is_default(name, value, default):
            continue
        if policy == "refuse":
            raise BonsaiError(f"{where}: {name}={value!r} is not supported: {why}; leave {name} at its "
                              f"default ({default!r})")
        warnings.warn(f"{where}: {name}={value!r} has no effect here: {why}", UserWarning, stacklevel=stacklevel)


def reject_unknown_keywords(given: Iterable[str], known: Iterable[str], where: str) -> None:
    """A TypeError naming the first keyword that `where` does not take, with the closest known one."""
    known = sorted(set(known))
    for name in given:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}{hint}")


def check_rope(model, freq_base: Any, freq_scale: Any) -> None:
    """rope_freq_base / rope_freq_scale of `model` (a _core.Model): 0 takes the model's, the model's
    own value is accepted; any other would change the results and cannot be applied: refused."""
    base = check_float("rope_freq_base", freq_base, 0.0, _FLT_MAX)
    scale = check_float("rope_freq_scale", freq_scale, 0.0, _FLT_MAX)
    if base == 0.0 and scale == 0.0:
        return
    hp, meta = model.hparams, model.metadata
    if base != 0.0 and not np.isclose(base, hp["rope_theta"], rtol=1e-6):
        raise BonsaiError(f"rope_freq_base={freq_base} is not supported: bonsai uses the model's rope base "
                          f"({hp['rope_theta']}); leave rope_freq_base at 0")
    factor = meta.get(f"{hp['arch']}.rope.scaling.factor")
    linear = meta.get(f"{hp['arch']}.rope.scaling.type") == "linear" and factor
    model_scale = 1.0 / float(factor) if linear else 1.0
    if scale != 0.0 and not np.isclose(scale, model_scale, rtol=1e-6):
        raise BonsaiError(f"rope_freq_scale={freq_scale} is not supported: bonsai uses the model's rope "
                          f"scaling ({model_scale}); leave rope_freq_scale at 0")


def cache_type_name(name: str, value: Any) -> str:
    """type_k / type_v: "f16" / "q8_0" (any case), llama.cpp's GGML type ids 1 / 8, or None (f16)."""
    if value is None:
        return "f16"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in _GGML_CACHE_TYPES:
            return _GGML_CACHE_TYPES[int(value)]
        raise BonsaiError(f"unsupported KV cache type {name}={int(value)} (a GGML type id); use 1 (F16) or "
                          "8 (Q8_0), or the names 'f16' / 'q8_0'")
    if isinstance(value, str) and value.lower() in _GGML_CACHE_TYPES.values():
        return value.lower()
    raise BonsaiError(f"unknown KV cache type {name}={value!r}; use one of f16, q8_0 (or the GGML type ids "
                      "1 / 8)")


@dataclass(frozen=True)
class LlamaState:
    """A snapshot of a Llama's sequence (what `save_state` returns, `load_state` takes): the
    evaluated tokens, their kept logits, the engine's state bytes (KV rows, recurrent state) and
    the identity of the model and context layout it belongs to."""

    input_ids: np.ndarray  # the evaluated tokens (int32)
    scores: np.ndarray  # the kept logits rows: every position with logits_all, else the last
    last_logits: np.ndarray  # the newest position's logits (what the next token is sampled from)
    n_tokens: int
    seq_state: bytes  # _core.Context.save_seq_state
    model_id: str  # see model_identity()
    logits_all: bool

    @property
    def llama_state_size(self) -> int:  # the name llama-cpp-python's LlamaState uses
        return len(self.seq_state)


def model_identity(path: str, metadata: Mapping[str, Any]) -> str:
    """A model's identity for LlamaState: its file size and a hash of its metadata and of 32 evenly
    spaced 4 KiB samples of the file (cheap for any size; two models differing only in their
    weights differ in the samples)."""
    h = hashlib.sha256()
    for k in sorted(metadata):
        h.update(k.encode())
        h.update(repr(metadata[k]).encode())
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        for i in range(32):
            f.seek(size * i // 32)
            h.update(f.read(4096))
    return f"{size}:{h.hexdigest()[:32]}"


def hub_download(repo_id: str, filename: str, *, local_dir: Optional[str], cache_dir: Optional[str],
                 revision: Optional[str] = None) -> str:
    """The local path of `filename` (a name or glob pattern) of Hugging Face repository `repo_id`,
    downloaded if needed (or found in the cache with HF_HUB_OFFLINE=1)."""
    try:
        import huggingface_hub
        from huggingface_hub import constants as hub_constants
    except ImportError:
        raise ImportError("Llama.from_pretrained needs the huggingface_hub package: "
                          "pip install huggingface_hub") from None
    if not isinstance(repo_id, str) or not repo_id:
        raise BonsaiError(f"repo_id must be a repository name like 'owner/name', not {repo_id!r}")
    if not isinstance(filename, str) or not filename:
        raise BonsaiError(f"filename must be a file name or glob pattern in the repository, not {filename!r}")
    name = filename
    if any(c in filename for c in "*?["):
        files = _repo_files(huggingface_hub, hub_constants, repo_id, cache_dir, revision)
        matches = sorted(f for f in files
                         if fnmatch.fnmatch(f, filename) or fnmatch.fnmatch(os.path.basename(f), filename))
        if not matches:
            raise BonsaiError(f"no file of {repo_id} matches {filename!r}; its files are: {', '.join(sorted(files))}")
        if len(matches) > 1:
            raise BonsaiError(f"{filename!r} matches {len(matches)} files of {repo_id} ({', '.join(matches)}); "
                              "give a pattern that matches one")
        name = matches[0]
    try:
        return huggingface_hub.hf_hub_download(repo_id=repo_id, filename=name, local_dir=local_dir,
                                               cache_dir=cache_dir, revision=revision)
    except Exception as e:  # the hub's errors: not found, offline without a cached copy, network
        raise BonsaiError(f"could not get {name!r} from {repo_id}: {type(e).__name__}: {e}") from None


def _repo_files(hub, constants, repo_id: str, cache_dir: Optional[str], revision: Optional[str]) -> list[str]:
    """The repository's file names: from the hub, or with HF_HUB_OFFLINE=1 from the local cache."""
    if constants.HF_HUB_OFFLINE:
        root = os.path.join(cache_dir or constants.HF_HUB_CACHE, "models--" + repo_id.replace("/", "--"))
        ref = os.path.join(root, "refs", revision or "main")
        rev = revision or "main"
        if os.path.isfile(ref):
            with open(ref, encoding="utf-8") as f:
                rev = f.read().strip()
        snap = os.path.join(root, "snapshots", rev)
        if not os.path.isdir(snap):
            raise BonsaiError(f"HF_HUB_OFFLINE is set and {repo_id} is not in the cache ({root}); "
                              "download it once online or unset HF_HUB_OFFLINE")
        return [os.path.relpath(os.path.join(d, f), snap).replace(os.sep, "/")
                for d, _, fs in os.walk(snap) for f in fs]
    try:
        return list(hub.list_repo_files(repo_id, revision=revision))
    except Exception as e:
        raise BonsaiError(f"could not list the files of {repo_id}: {type(e).__name__}: {e}") from None
