"""Decoder layers from transformers' own modeling code, materialized one at a time, in torch.

The calibration forward is the architecture's reference implementation, not a re-implementation:
the model class transformers registers for the checkpoint's `model_type` is built on the meta
device (no memory: a skeleton of shapes), and a layer is run with `torch.func.functional_call`
on the tensors read from the checkpoint for that one layer (float32 on the quantizer's device).
So a layer costs its own weights only, the same skeleton serves the float and the quantized
versions of a layer (two dicts of tensors), and gradients for the scale refinement come from
autograd through the same forward (refine.py).

- Rotary position embeddings: the model's own rotary module, re-created on the device (its
  buffers were meta); every rope_scaling transformers implements works.
- Attention: "sdpa" with no mask, which transformers runs as causal attention over each
  calibration sequence (all sequences are full length; no padding).
- Activations: forward pre-hooks on the layer's linear modules capture their inputs (the
  "capture" callbacks of the pipeline), and can stop the forward once the wanted input is seen.
- Rotation (`--rotate`, rotation.py): with `rotation` set, the rotated linears' inputs are
  replaced by WHT_B(s ⊙ x) in a pre-hook that runs before the capture hooks, so the captured
  activations are the rotated ones (the weights handed in are then the rotated rows).
- Precision of the calibration forward (`forward_dtype`): float32, or bfloat16 autocast (the
  matrix products and attention in bfloat16, norms and the residual stream in float32) where the
  device multiplies bfloat16 natively (resolve_forward_dtype). Captured inputs and the layer output
  are handed back in float32 either way; the weights the quantizer fits and the Hessian sums stay
  float32. Why bfloat16 is safe there: its rounding (2^-9 relative per element) is ~100x below
  the ternary layer-output errors the calibration measures (0.1-0.3 relative), and the measured
  mean KLD of the result is the same (README, quantizer speed).

Keys: the pipeline names the tensors of a layer by short keys (q, k, v, o, gate, up, down, their
biases, the norms; for Qwen3.5's Gated DeltaNet layers qkv, z, a, b, ssm_out and the small GDN
tensors); `HF_KEYS` maps them to the transformers parameter names inside the layer. A layer holds
the keys of its kind only (a Qwen3.5 attention layer q/k/v/o, a GDN layer qkv/z/a/b/ssm_out), and
the pipeline skips the keys a layer does not have. `linear_inputs`
discovers, for ANY decoder layer, which linear modules share an input (the quantization stages),
by one hooked forward; tests/test_quantize_torch.py runs it on Qwen3.5's hybrid layers (Gated
DeltaNet and gated attention).
"""

from __future__ import annotations

import re

import torch

from ..errors import BonsaiError

LINEARS = ("q", "k", "v", "o", "qkv", "z", "a", "b", "ssm_out", "gate", "up", "down")
HF_KEYS = {
    "attn_norm": "input_layernorm.weight",
    "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
    # Qwen3.5 Gated DeltaNet (linear attention) layers
    "qkv": "linear_attn.in_proj_qkv.weight", "z": "linear_attn.in_proj_z.weight",
    "a": "linear_attn.in_proj_a.weight", "b": "linear_attn.in_proj_b.weight",
    "ssm_out": "linear_attn.out_proj.weight", "conv1d": "linear_attn.conv1d.weight",
    "A_log": "linear_attn.A_log", "dt_bias": "linear_attn.dt_bias",
    "ssm_norm": "linear_attn.norm.weight",
}
# Which captured activation feeds each linear layer, and the module whose input it is.
INPUT_OF = {"q": "attn_in", "k": "attn_in", "v": "attn_in", "o": "o_in",
            "qkv": "gdn_in", "z": "gdn_in", "a": "gdn_in", "b": "gdn_in", "ssm_out": "gdn_out_in",
            "gate": "ffn_in", "up": "ffn_in", "down": "down_in"}
CAPTURE_MODULE = {"attn_in": "self_attn.q_proj", "o_in": "self_attn.o_proj",
                  "gdn_in": "linear_attn.in_proj_qkv", "gdn_out_in": "linear_attn.out_proj",
                  "ffn_in": "mlp.gate_proj", "down_in": "mlp.down_proj"}
# Inputs of a token mixer's LAST linear (its output is the mixer's output): once that linear is
# quantized, the later stages of the block take the mixer's output from the cached inputs
# instead of re-running attention / the delta rule (BlockRunner.shortcut checks that it is exact).
SHORTCUT_INPUTS = ("o_in", "gdn_out_in")
# Quantization stages inside a block: layers sharing an input are quantized together, and each
# stage sees the outputs of the already-quantized stages before it. A layer has either the
# attention stages (q/k/v, o) or the GDN ones (qkv/z/a/b, ssm_out); the others are skipped.
STAGES = (("q", "k", "v"), ("o",), ("qkv", "z", "a", "b"), ("ssm_out",), ("gate", "up"),
          ("down",))
LAYER_PREFIXES = ("model.layers.", "model.language_model.layers.")


def resolve_device(spec: str) -> torch.device:
    """--device: auto (CUDA when available), cpu, cuda or cuda:N; one clear error otherwise."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    m = re.fullmatch(r"cuda(?::(\d+))?", spec or "")
    if not m:
        raise BonsaiError(f"--device {spec!r}: one of auto, cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise BonsaiError(f"--device {spec}: no CUDA GPU is available to torch here "
                          f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                          "use --device cpu, or install a CUDA build of torch")
    n = torch.cuda.device_count()
    if m.group(1) is not None and int(m.group(1)) >= n:
        raise BonsaiError(f"--device {spec}: only {n} CUDA device(s) (cuda:0 .. cuda:{n - 1})")
    return torch.device(spec)


def _native_bf16(device: torch.device) -> bool:
    """bfloat16 matrix products in hardware: CUDA from compute capability 8.0 (Ampere), x86 CPUs
    with AVX512_BF16 or AMX (on the others torch emulates them, slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        cpu = torch.cpu
        return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                    or getattr(cpu, "_is_amx_tile_supported", lambda: False)())
    return False


FORWARD_DTYPES = ("auto", "float32", "bfloat16")


def resolve_forward_dtype(spec: str, device: torch.device) -> torch.dtype:
    """--forward-dtype: auto (bfloat16 where the device has it natively, else float32),
    float32, bfloat16."""
    if spec not in FORWARD_DTYPES:
        raise BonsaiError(f"--forward-dtype {spec!r}: one of {', '.join(FORWARD_DTYPES)}")
    if spec == "auto":
        return torch.bfloat16 if _native_bf16(device) else torch.float32
    return torch.bfloat16 if spec == "bfloat16" else torch.float32


class _Stop(Exception):
    """Raised by a capture hook to end the layer forward once the wanted input is captured."""


class HfLayers:
    """The checkpoint's decoder layers as transformers modules on the meta device (see the file
    header); `forward` runs one of them on given weights."""

    def __init__(self, config: dict, device: torch.device, where: str = "config.json",
                 forward_dtype: torch.dtype = torch.float32):
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        model_type = config.get("model_type")
        kwargs = {k: v for k, v in config.items() if k != "model_type"}
        try:
            cfg = AutoConfig.for_model(model_type, **kwargs)
        except (ValueError, KeyError, TypeError) as e:
            raise BonsaiError(f"{where}: model_type {model_type!r} is not an architecture "
                              f"transformers {transformers.__version__} implements ({e})") from None
        cfg = cfg.get_text_config()
        cfg._attn_implementation = "sdpa"
        cfg.use_cache = False
        self.config = cfg
        self.device = device
        self.forward_dtype = forward_dtype
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.layers = base.layers
        self.norm = base.norm
        rot = getattr(base, "rotary_emb", None)
        self.rotary = None
        if rot is not None:  # built on the device (not every version's rotary module takes device=)
            with torch.device(device):
                self.rotary = type(rot)(config=cfg).to(device)
        self._pos: dict[int, tuple] = {}
        self.rotation = None       # rotation.Rotation: rotate the inputs of its linear modules

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def param_names(self, i: int) -> list[str]:
        return [n for n, _ in self.layers[i].named_parameters()]

    def _kwargs(self, x: torch.Tensor) -> dict:
        T = x.shape[1]
        if T not in self._pos:
            pos = torch.arange(T, device=self.device)[None]
            pe = None if self.rotary is None else self.rotary(x[:1], pos)
            self._pos = {T: (pos, pe)}
        pos, pe = self._pos[T]
        kw = {"attention_mask": None, "position_ids": pos}
        if pe is not None:
            kw["position_embeddings"] = pe
        return kw

    def forward(self, i: int, params: dict[str, torch.Tensor], x: torch.Tensor,
                capture=None, stop_after: str | None = None, replace=None
                ) -> torch.Tensor | None:
        """Layer i's output (float32) for hidden states x [B, T, d] on the device, with weights
        `params` (transformers names inside the layer), computed in `forward_dtype` (the file
        header). capture(module name, input [B*T, in], float32) is called with the input of every
        linear module; after `stop_after`'s input the forward ends and None is returned. Under
        autograd (the scale refinement) the forward is float32 always.

        replace = (module name, make): that submodule is not run; its output is make(layer), where
        make may call the layer's own submodules (their weights are `params`, and the capture
        hooks see them): the cached-input shortcut of the pipeline (BlockRunner.shortcut)."""
        layer = self.layers[i]
        hooks = []
        if replace is not None:
            name, make = replace
            layer.get_submodule(name).forward = lambda *a, **k: make(layer)
        if self.rotation is not None:
            rotated, done = self.rotation.module_names(), {}

            def rot(m, args):
                a = args[0]
                key = id(a)
                if key not in done:     # q/k/v (gate/up) share one input: rotate it once
                    done[key] = (a, self.rotation.apply(a).to(a.dtype))
                return (done[key][1],) + tuple(args[1:])
            for name, mod in layer.named_modules():
                if name in rotated:
                    hooks.append(mod.register_forward_pre_hook(rot))
        if capture is not None:
            for name, mod in layer.named_modules():
                if isinstance(mod, torch.nn.Linear):
                    def pre(m, args, name=name):
                        a = args[0]
                        with torch.autocast(self.device.type, enabled=False):   # float32 sums
                            capture(name, a.reshape(-1, a.shape[-1]).float())
                        if name == stop_after:
                            raise _Stop
                    hooks.append(mod.register_forward_pre_hook(pre))
        low = self.forward_dtype != torch.float32 and not torch.is_grad_enabled()
        try:
            with torch.autocast(self.device.type, dtype=self.forward_dtype, enabled=low):
                out = torch.func.functional_call(layer, params, (x,), self._kwargs(x),
                                                 strict=True)
        except _Stop:
            return None
        finally:
            for h in hooks:
                h.remove()
            if replace is not None:
                del layer.get_submodule(replace[0]).forward      # back to the class's forward
        out = out[0] if isinstance(out, tuple) else out
        return out.float()

    def final_norm(self, weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.norm, {"weight": weight}, (h,))


def linear_inputs(hl: HfLayers, i: int, params: dict, x: torch.Tensor) -> list[list[str]]:
    """The linear modules of layer i grouped by the input they share, in forward order: the
    quantization stages of any decoder layer (e.g. Qwen3.5's GDN layer: [in_proj_qkv, in_proj_z,
    in_proj_b, in_proj_a], [out_proj], [gate_proj, up_proj], [down_proj])."""
    seen: list[tuple[torch.Tensor, list[str]]] = []

    def cap(name, a):
        for t, names in seen:
            if t.shape == a.shape and torch.equal(t, a):
                names.append(name)
                return
        seen.append((a.detach().clone(), [name]))

    hl.forward(i, params, x, cap)
    return [names for _, names in seen]


__all__ = ["FORWARD_DTYPES", "HF_KEYS", "INPUT_OF", "LINEARS", "SHORTCUT_INPUTS", "STAGES",
           "HfLayers", "linear_inputs", "resolve_device", "resolve_forward_dtype"]
