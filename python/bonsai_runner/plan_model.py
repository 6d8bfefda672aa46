"""What the memory planner needs to know about a model: hyperparameters and every tensor the engine
binds, with its type and byte size — read from a GGUF file, or derived from a Hugging Face
config.json plus a quantization scheme, or from a named preset.

The tensor list is the engine's (cpp/src/arch/*.cpp): token_embd, output_norm, output (absent when
tied), optional rope_freqs, and per block attn_norm, attn_q/k/v/output, ffn_norm, ffn_gate/up/down,
plus q/k/v biases (qwen2) or per-head q/k norms (qwen3). qwen35 (hybrid) blocks are either
attention blocks (attn_norm, attn_q [query + gate], attn_k/v/output, attn_q/k_norm,
post_attention_norm, ffn_*) or Gated DeltaNet blocks (attn_norm, attn_qkv, attn_gate, ssm_alpha,
ssm_beta, ssm_out, ssm_conv1d, ssm_dt.bias, ssm_a, ssm_norm, post_attention_norm, ffn_*); the
conv taps are copied to float32 at load like the 1-D tensors. Tensors a file holds beyond these are
not loaded and not counted.

Schemes for a config.json (no weights are read; sizes follow from shapes and type geometry):
  policy        the quantizer's default (quantize/policy.py): ternary PTQ1_0 q/k/v/o/gate/up,
                Q8_0 down_proj, Q8_0 embedding and head, F32 1-D tensors — before any sensitivity
                fallback, which promotes more tensors to Q8_0.
  outtype T     the converter's rules (convert/outtypes.py), including its F16 fallback for rows
                that do not split into T's blocks.
  target-bpw B  the quantizer's greedy promotion through PTQ1_0 -> Q2_0_4L -> Q4_0 -> Q8_0 until the
                linear-layer average reaches B; the quantizer ranks tensors by measured error, the
                planner by a proxy (error ~ 2^-bpw), so the chosen tensors may differ but the total
                is the same up to one promotion step of one tensor.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BonsaiError
from .ggml_types import type_info

ROLE_EMBD, ROLE_OUTPUT, ROLE_MATRIX, ROLE_VECTOR = "token_embd", "output", "matrix", "vector"


@dataclass
class PlanTensor:
    name: str            # llama.cpp name
    type_name: str       # "F16", "PTQ1_0", ... (ggml spelling)
    nbytes: int
    n_elements: int
    role: str            # ROLE_*
    layer: int | None    # block index, None for token_embd / output / output_norm / rope_freqs
    n_cols: int = 0      # row length of a matrix (one row of token_embd is read per token)


@dataclass
class ModelDesc:
    source: str          # what was described (path or preset name)
    scheme: str          # how the types were chosen ("file", "policy", "outtype f16", ...)
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    tied: bool
    tensors: list[PlanTensor] = field(default_factory=list)
    vocab_text_bytes: int | None = None   # bytes of all token texts, when known
    notes: list[str] = field(default_factory=list)
    # hybrid (qwen35) models: per block, True for a recurrent (Gated DeltaNet) block, which has no
    # KV cache but a per-sequence state; empty for the dense architectures
    recurrent: list[bool] = field(default_factory=list)
    attn_output_gate: bool = False        # attn_q holds query and gate (qwen35)
    ssm_conv_kernel: int = 0
    ssm_conv_dim: int = 0                 # 2 x K heads x dk + V heads x dv
    ssm_n_v_heads: int = 0
    ssm_dv: int = 0
    ssm_dk: int = 0

    @property
    def n_state_layer(self) -> int:
        return sum(self.recurrent)

    @property
    def n_kv_layer(self) -> int:
        return self.n_layer - self.n_state_layer

    def kv_layers_below(self, n: int) -> int:
        """Attention (KV) blocks among the first n blocks."""
        n = max(0, min(n, self.n_layer))
        return n - sum(self.recurrent[:n]) if self.recurrent else n

    @property
    def recurrent_floats_per_seq(self) -> int:
        """One sequence's live state: per GDN block the conv window ((kernel - 1) x conv_dim) and
        the delta-rule state (V heads x dv x dk), float32 (cpp/src/recurrent_state.cpp)."""
        per_layer = ((self.ssm_conv_kernel - 1) * self.ssm_conv_dim
                     + self.ssm_n_v_heads * self.ssm_dv * self.ssm_dk)
        return self.n_state_layer * per_layer

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def linear_bpw(self) -> float:
        lin = [t for t in self.tensors if t.role == ROLE_MATRIX]
        n = sum(t.n_elements for t in lin)
        return 8.0 * sum(t.nbytes for t in lin) / n if n else 0.0


# The reference model of SPEC section 1: a 27B Llama-family decoder with 60 blocks, hidden 5120 and
# a 32000-token vocabulary. Heads and FFN width are chosen as a typical shape of that size: 40 query
# heads of 128 with grouped-query attention over 8 KV heads (as Llama-2-70B / Llama-3), and an FFN
# of 24576 (4.8 x hidden), which gives 26.75 B parameters (53.5 GB at FP16).
PRESETS = {
    "27b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 5120,
            "num_hidden_layers": 60, "num_attention_heads": 40, "num_key_value_heads": 8,
            "intermediate_size": 24576, "vocab_size": 32000, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 16384,
            "tie_word_embeddings": False, "torch_dtype": "float16"},
}


_QWEN35_COMMON = ["attn_norm", "post_attention_norm", "ffn_gate", "ffn_up", "ffn_down"]
_QWEN35_ATTN = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"]
_QWEN35_GDN = ["attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out", "ssm_conv1d",
               "ssm_norm"]


def _engine_tensor_names(arch: str, n_layer: int,
                         recurrent: list[bool] | None = None) -> list[tuple[str, int | None]]:
    names: list[tuple[str, int | None]] = [
        ("token_embd.weight", None), ("output_norm.weight", None), ("output.weight", None),
        ("rope_freqs.weight", None)]
    for i in range(n_layer):
        b = f"blk.{i}."
        if arch == "qwen35":
            gdn = bool(recurrent and recurrent[i])
            per = _QWEN35_COMMON + (_QWEN35_GDN if gdn else _QWEN35_ATTN)
            names += [(b + p + ".weight", i) for p in per]
            if gdn:
                names += [(b + "ssm_dt.bias", i), (b + "ssm_a", i)]
            continue
        per = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
               "ffn_up", "ffn_down"]
        if arch == "qwen2":
            names += [(b + f"attn_{p}.bias", i) for p in "qkv"]
        if arch == "qwen3":
            per += ["attn_q_norm", "attn_k_norm"]
        names += [(b + p + ".weight", i) for p in per]
    return names


def _role(name: str, ndim: int) -> str:
    if name == "token_embd.weight":
        return ROLE_EMBD
    if name == "output.weight":
        return ROLE_OUTPUT
    if name.endswith(".ssm_conv1d.weight"):      # copied to float32 at load, like a 1-D tensor
        return ROLE_VECTOR
    return ROLE_MATRIX if ndim == 2 else ROLE_VECTOR


def _qwen35_recurrent(md: dict, n_layer: int, path) -> list[bool]:
    flags = md.get("qwen35.attention.recurrent_layers")
    if isinstance(flags, list):
        if len(flags) < n_layer:
            raise BonsaiError(f"{path}: qwen35.attention.recurrent_layers has {len(flags)} entries "
                              f"for {n_layer} blocks; re-convert the model")
        return [bool(f) for f in flags[:n_layer]]
    interval = int(md.get("qwen35.full_attention_interval", 4))
    if interval <= 0:
        raise BonsaiError(f"{path}: qwen35.full_attention_interval must be positive")
    return [(i + 1) % interval != 0 for i in range(n_layer)]


# ----- GGUF files -----

def describe_gguf(path: str | os.PathLike) -> ModelDesc:
    """The tensors the engine would bind from `path`, with their stored types and sizes."""
    from .gguf_reader import open_gguf

    with open_gguf(path) as g:
        md = g.metadata
        arch = md.get("general.architecture")
        if arch is None:
            raise BonsaiError(f"{path}: no general.architecture key; it is not a model file")
        if arch not in ("llama", "qwen2", "qwen3", "qwen35"):
            raise BonsaiError(f"{path}: unsupported model architecture {arch!r}; the engine runs "
                              "llama, qwen2, qwen3 and qwen35")

        def key(k, default=None):
            v = md.get(f"{arch}.{k}", default)
            if v is None:
                raise BonsaiError(f"{path}: metadata key {arch}.{k} is missing; re-convert "
                                  "the model")
            return v

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", n_embd // max(n_head, 1)))
        by_name = {t.name: t for t in g.tensors}
        if "token_embd.weight" not in by_name:
            raise BonsaiError(f"{path}: tensor 'token_embd.weight' is missing; re-convert "
                              "the model")
        emb = by_name["token_embd.weight"]
        n_vocab = int(md.get(f"{arch}.vocab_size") or emb.ne[1])
        d = ModelDesc(source=os.fspath(path), scheme="file", arch=arch, n_vocab=n_vocab,
                      n_embd=n_embd, n_layer=int(key("block_count")), n_head=n_head,
                      n_head_kv=int(key("attention.head_count_kv", n_head)), head_dim=head_dim,
                      n_ff=int(key("feed_forward_length")),
                      n_rot=int(key("rope.dimension_count", head_dim)),
                      tied="output.weight" not in by_name)
        if arch == "qwen35":
            d.recurrent = _qwen35_recurrent(md, d.n_layer, path)
            d.attn_output_gate = True
            n_v, dk = int(key("ssm.time_step_rank")), int(key("ssm.state_size"))
            n_k = int(key("ssm.group_count"))
            d.ssm_conv_kernel, d.ssm_n_v_heads, d.ssm_dk = int(key("ssm.conv_kernel")), n_v, dk
            d.ssm_dv = int(key("ssm.inner_size")) // max(n_v, 1)
            d.ssm_conv_dim = 2 * n_k * dk + n_v * d.ssm_dv
        tokens = md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list):
            d.vocab_text_bytes = sum(len(s.encode("utf-8", "replace")) for s in tokens)
        unsupported = []
        for name, layer in _engine_tensor_names(arch, d.n_layer, d.recurrent):
            t = by_name.get(name)
            if t is None:
                if name in ("output.weight", "rope_freqs.weight"):
                    continue
                raise BonsaiError(f"{path}: tensor {name!r} is missing (required by the {arch} "
                                  "architecture); re-convert the model")
            nbytes = int(t.nbytes)
            if t.engine_type is not None and len(t.ne) == 2:
                nbytes = type_info(t.engine_type).row_bytes(int(t.ne[0])) * int(t.ne[1])
            elif t.engine_type is None:
                unsupported.append(f"{name} ({t.type_name})")
            d.tensors.append(PlanTensor(name, t.type_name, nbytes, int(t.n_elements),
                                        _role(name, len(t.ne)), layer, int(t.ne[0])))
        signs = md.get("prism.hadamard.sign_values")
        if isinstance(signs, list) and signs:
            # a rotated file (prism.hadamard): the engine holds its sign vectors as float32
            d.tensors.append(PlanTensor("prism.hadamard.sign_values", "F32", 4 * len(signs), len(signs),
                                        ROLE_VECTOR, None, len(signs)))
        if unsupported:
            d.notes.append(f"{len(unsupported)} tensor(s) have types the engine has no kernel for "
                           f"(e.g. {unsupported[0]}); sizes are as stored, but the engine will "
                           "refuse the file until it is converted (bonsai convert --outtype ...)")
    return d


# ----- Hugging Face configs and presets -----

def _read_config(path: str | os.PathLike) -> tuple[dict, str]:
    from .convert.hf_reader import read_json

    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.is_file():
        raise BonsaiError(f"{path}: expected a GGUF file, a Hugging Face model directory with "
                          "config.json, or a config.json file")
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise BonsaiError(f"{cfg_path}: expected a JSON object")
    return cfg, os.fspath(cfg_path)


def _types_outtype(specs, outtype: str, float_default: str) -> dict[str, str]:
    from .convert.arch.base import F32_ROLES
    from .convert.outtypes import FREE_OUTTYPES, fits_block

    out = {}
    for s in specs:
        if len(s.shape) == 1 or s.role in F32_ROLES:
            t = "f32"
        elif s.role in ("token_embd", "output"):
            t = outtype if outtype in FREE_OUTTYPES else "f16"
            t = float_default if outtype == "auto" else t
        else:
            t = float_default if outtype == "auto" else outtype
        if len(s.shape) == 2 and not fits_block(t, s.shape[-1]):
            t = "f16"
        out[s.hf_name] = t
    return out


def _types_policy(specs, target_bpw: float | None) -> dict[str, str]:
    from .quantize.policy import (Policy, check_target, promote_to_target, promotion_chain, tier_bpw,
                                  tier_file_type)

    from .convert.arch.base import F32_ROLES

    pol = Policy()
    out = {s.hf_name: "f32" if s.role in F32_ROLES else pol.type_of(s.hf_name, len(s.shape))[0]
           for s in specs}
    if target_bpw is not None:
        lin = [s for s in specs if s.role == "linear"]
        check_target(target_bpw, [(s.hf_name, _numel(s.shape), None) for s in lin], pol.ternary)
        items = {s.hf_name: {"params": _numel(s.shape), "pinned": None,
                             "err": {t: 2.0 ** -tier_bpw(t) for t in promotion_chain(pol.ternary)}}
                 for s in lin}
        out.update(promote_to_target(target_bpw, items, pol.ternary))
    out = {name: tier_file_type(t) for name, t in out.items()}
    for s in specs:
        t = out[s.hf_name]
        if len(s.shape) == 2 and s.shape[-1] % type_info(t).block_size:
            raise BonsaiError(f"{s.hf_name}: {s.shape[-1]} input columns do not split into "
                              f"blocks of {type_info(t).block_size} for {t.upper()}; the quantizer "
                              "refuses this shape too (give it another type with --policy, or plan "
                              "with --outtype)")
    return out


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def describe_config(config: dict, source: str, outtype: str | None = None,
                    target_bpw: float | None = None) -> ModelDesc:
    """The tensors a file converted from this config would hold (see the module doc for schemes)."""
    from .convert.arch import family_for

    if outtype is not None and target_bpw is not None:
        raise BonsaiError("--outtype and --target-bpw are two different schemes; give one")
    fam = family_for(config, source)
    hp = fam.hp
    specs = fam.tensor_specs()
    float_default = "bf16" if str(config.get("torch_dtype", "")).lower() == "bfloat16" else "f16"
    if outtype is not None:
        from .convert.outtypes import OUTTYPES

        if outtype.lower() not in OUTTYPES:
            raise BonsaiError(f"--outtype {outtype}: unknown; use one of {', '.join(OUTTYPES)}")
        types = _types_outtype(specs, outtype.lower(), float_default)
        scheme = f"outtype {outtype.lower()}"
    else:
        types = _types_policy(specs, target_bpw)
        scheme = "PTQ1_0 default policy" if target_bpw is None else f"target {target_bpw} bpw"
    d = ModelDesc(source=source, scheme=scheme, arch=fam.gguf_arch, n_vocab=hp.n_vocab,
                  n_embd=hp.n_embd, n_layer=hp.n_layer, n_head=hp.n_head, n_head_kv=hp.n_head_kv,
                  head_dim=hp.head_dim, n_ff=hp.n_ff, n_rot=getattr(fam, "rope_dim", hp.head_dim),
                  tied=hp.tied)
    if fam.gguf_arch == "qwen35":
        d.recurrent, d.attn_output_gate = list(fam.recurrent), True
        d.ssm_conv_kernel, d.ssm_conv_dim = fam.conv_kernel, fam.conv_dim
        d.ssm_n_v_heads, d.ssm_dv, d.ssm_dk = fam.n_v, fam.dv, fam.dk
    for s in specs:
        t = type_info(types[s.hf_name])
        shape = s.gguf_shape
        n = _numel(shape)
        nbytes = t.row_bytes(shape[-1]) * (n // shape[-1])
        layer = int(s.gguf_name.split(".")[1]) if s.gguf_name.startswith("blk.") else None
        d.tensors.append(PlanTensor(s.gguf_name, t.name, nbytes, n,
                                    _role(s.gguf_name, len(shape)), layer, int(shape[-1])))
    for name, arr in fam.extra_tensors():
        n = int(arr.size)
        d.tensors.append(PlanTensor(name, "F32", 4 * n, n, ROLE_VECTOR, None, n))
    n_signs = _quantizer_sign_count(fam.gguf_arch, specs) if outtype is None else 0
    if n_signs:
        d.tensors.append(PlanTensor("prism.hadamard.sign_values", "F32", 4 * n_signs, n_signs,
                                    ROLE_VECTOR, None, n_signs))
    if outtype is None:
        d.notes.append("types before the quantizer's sensitivity analysis: each linear layer it "
                       "keeps at Q8_0 adds (8.5 - 1.75) / 8 bytes per weight")
    return d


def _quantizer_sign_count(arch: str, specs) -> int:
    """The sign values of the rotation `bonsai quantize --rotate auto` folds in (one vector per
    distinct input width of the decoder linears; quantize/rotation.py), which the engine holds
    as float32: 0 for qwen35 or widths without a common power-of-two factor (not rotated)."""
    from .convert.hadamard_fold import FOLDABLE

    if arch == "qwen35":
        return 0
    widths = {int(s.gguf_shape[-1]) for s in specs if FOLDABLE.match(s.gguf_name)}
    g = 0
    for w in widths:
        g = math.gcd(g, w)
    return sum(widths) if g and g % 2 == 0 else 0


def describe_hf(path: str | os.PathLike, outtype: str | None = None,
                target_bpw: float | None = None) -> ModelDesc:
    cfg, source = _read_config(path)
    return describe_config(cfg, source, outtype, target_bpw)


def describe_preset(name: str, outtype: str | None = None,
                    target_bpw: float | None = None) -> ModelDesc:
    cfg = PRESETS.get(name.lower())
    if cfg is None:
        raise BonsaiError(f"--preset {name}: unknown; known presets: {', '.join(PRESETS)}")
    d = describe_config(dict(cfg), f"preset {name.lower()}", outtype, target_bpw)
    return d


def describe(source: str | None, preset: str | None = None, outtype: str | None = None,
             target_bpw: float | None = None) -> ModelDesc:
    """One entry point for the command: a .gguf file, a HF directory / config.json, or a preset."""
    if (source is None) == (preset is None):
        raise BonsaiError("give a model (a .gguf file, a Hugging Face directory or config.json) "
                          "or --preset, not both")
    if preset is not None:
        return describe_preset(preset, outtype, target_bpw)
    p = Path(source)
    if not p.exists():
        raise BonsaiError(f"{source}: not found")
    if p.is_file() and p.suffix.lower() != ".json":
        if outtype is not None or target_bpw is not None:
            raise BonsaiError("--outtype / --target-bpw choose types for a config.json; a GGUF "
                              "file is planned with the types it holds (convert it first)")
        return describe_gguf(p)
    return describe_hf(p, outtype, target_bpw)
