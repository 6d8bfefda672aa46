"""The quantizer: a Hugging Face checkpoint + calibration text -> a PTQ1_0 directory (-> GGUF).

Order of work (each step fails with one clear error before anything is written):
1. open the checkpoint (hf_reader), pick its family (arch/), validate every tensor, load the
   tokenizer, refuse an existing output without --force, parse the policy;
2. scan the linear weights for already-ternary ones (convert/ternary.py): those are packed
   losslessly; when every linear weight is, no calibration is needed at all;
3. tokenize the calibration set (calibration.py);
4. with --target-bpw, a float pre-pass (block by block) estimates every unpinned linear layer's
   output error at every tier by the plain fit (no GPTQ) on its float inputs, and one global
   greedy promotion fixes the tiers (policy.py); the main pass then runs GPTQ at that one tier;
5. embed the calibration tokens, then block by block (only that block's weights and the
   calibration hidden states in memory, loaded through `BlockLoader`; the block runs as
   transformers' own decoder layer, hf_layers.py):
   a. stage by stage (q/k/v, o, gate/up, down: hf_layers.STAGES) accumulate the Hessian of the
      stage's input *through the already-quantized part of the block*, quantize each layer (GPTQ +
      scale refit, gptq.py), record cosine / relative output error, and with
      --sensitivity-analysis send layers under --threshold to Q8_0;
   b. with --calib-steps, reconstruct the block: learn its scales against the float model's
      block output, early-stopped on held-out sequences (refine.py);
   c. write the block's tensors, run the quantized block to get the next block's inputs;
6. with --sensitivity-analysis, one more sweep gives each block's held-out loss increase
   (sensitivity.py); the fallback table and bits-per-weight summary are printed, and the
   directory is written under a temporary name and renamed (ptq1_dir.Ptq1DirWriter);
7. with --outfile, the directory is converted to GGUF (convert.convert). With --outfile alone (no
   --output-dir) the directory is a temporary one beside the GGUF, removed at the end.

The per-tensor cosine / relative error in the table are measured on the calibration Hessian right
after GPTQ (before --calib-steps refinement, whose block-level effect is reported separately);
loss_delta is the block-level held-out loss increase, repeated on each of the block's tensors.

Compute: torch on `--device` (auto: CUDA when available), float32 (gptq.py says where float64 is
used and why). The block's weights, the Hessians and the batch being run live on the device; the
calibration hidden states live on the host and go to the device one batch at a time (on the
CPU they are used in place). Time per stage is reported (`report["timing"]`, quant_config.json's
calibration.timing) with the device.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import BonsaiError
from .fisher import fisher_sequences, keep_dtype, output_fisher, predicted_loss
from .gptq import (ESTIMATE_ROWS, LayerResult, dequantize, grid, plain_fit_row_errors,
                   auto_ridge, prepare_hessian, quantize_absmean, quantize_layer, quantize_rtn,
                   reference_codes, with_ridge)
from .hf_layers import (CAPTURE_MODULE, HF_KEYS, INPUT_OF, LINEARS, SHORTCUT_INPUTS, STAGES,
                        HfLayers, resolve_device, resolve_forward_dtype)
from .policy import (DEFAULT_EMBED_TYPE, QUANT_TIERS, Policy, check_target,
                     parse_policy, promote_to_target, promotion_chain)
from .sensitivity import HeldOut, held_out_split, output_metrics

METHODS = ("gptq", "rtn")
TARGET_GAINS = ("fisher", "relative", "output")   # policy.py: how --target-bpw weighs errors


@dataclass
class QuantizeOptions:
    model_dir: str
    output_dir: str | None    # None: only --outfile, through a temporary directory
    calib_file: str | None = None          # None: the built-in calibration set
    outfile: str | None = None
    batch_size: int = 8                    # sequences per forward batch
    calib_steps: int = 0
    lr: float = 1e-3
    sensitivity: bool = False
    threshold: float = 0.98
    target_bpw: float | None = None
    group_size: int = 128
    max_samples: int = 128
    seq_len: int = 512
    seed: int = 0
    policy: str | None = None
    embed_type: str = DEFAULT_EMBED_TYPE
    damp: float = 0.01
    ridge: float | None = None             # layer-objective ridge (gptq.with_ridge); None: auto
    method: str = "gptq"                   # "gptq" (calibrated) or "rtn" (no data, baseline)
    equalize: bool = False                 # activation-aware channel scaling (equalize.py)
    refine_target: str = "float"           # "float": the float model's stream; "block": same x
    float_target: bool = False             # GPTQ toward the float model's layer outputs
    held_out: int = 4                      # held-out sequences for the loss (sensitivity)
    target_gain: str = "fisher"            # --target-bpw gain: "fisher", "relative" or "output"
    force: bool = False
    progress: bool = True
    device: str = "auto"                   # auto | cpu | cuda | cuda:N (hf_layers.resolve_device)
    forward_dtype: str = "auto"            # calibration forward: auto | float32 | bfloat16
    rotate: str | None = "auto"            # auto | none | hadamard | hadamard:B (rotation.py)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class BlockLoader:
    """Reads the checkpoint one block (or one named tensor) at a time, as float32 numpy arrays
    (the pipeline moves them to its device as torch tensors)."""

    def __init__(self, ckpt):
        self.ckpt = ckpt

    def load_block(self, i: int) -> dict[str, np.ndarray]:
        names = set(self.ckpt.tensor_names())
        out = {}
        for key, hf in HF_KEYS.items():
            name = f"model.layers.{i}.{hf}"
            if name in names:
                out[key] = self.read(name)
        return out

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 (a new array); its mapped source pages are released."""
        from ..mapped_pages import release

        x = self.ckpt.read_float32(name)
        if hasattr(self.ckpt, "read_raw"):
            release(self.ckpt.read_raw(name))
        return x


@dataclass
class BlockReport:
    index: int
    layers: dict = field(default_factory=dict)     # key -> {tier, err_plain, err_gptq, err, cosine}
    refine: dict | None = None


class Timer:
    """Seconds spent per stage of the run (summed over blocks), for the report."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


GRAM_PANELS = 4          # row panels of the Hessian sums (_gram_add)


def _gram_add(H: torch.Tensor | None, a: torch.Tensor) -> torch.Tensor:
    """H + a^T a on and above the diagonal only (the rest of H is left as it was: _symmetric
    fills it at the end). GRAM_PANELS row panels, panel p = a_p^T a[:, p:], do 10/16 of the
    full product's multiplications, measured 0.048 vs 0.066 s for a [4096, 896] float32 batch on
    one thread; each entry is the same dot product as in the full product."""
    n = a.shape[1]
    if H is None:
        H = torch.zeros((n, n), dtype=a.dtype, device=a.device)
    edges = [round(p * n / GRAM_PANELS) for p in range(GRAM_PANELS + 1)]
    for p0, p1 in zip(edges, edges[1:]):
        if p1 > p0:
            H[p0:p1, p0:].addmm_(a[:, p0:p1].T, a[:, p0:])
    return H


def _symmetric(H: torch.Tensor, scale: float) -> torch.Tensor:
    """scale x the symmetric matrix whose upper triangle is H's (_gram_add's sums)."""
    U = torch.triu(H)
    return (U + torch.triu(U, 1).T) * scale


@dataclass
class Shortcut:
    """A token mixer's output from its last linear's cached inputs (hf_layers.SHORTCUT_INPUTS):
    for the calibration stream's sequences, once that linear is quantized, the mixer's output is
    that linear applied to the inputs captured when its Hessian was accumulated. The later stages
    of the block (the FFN's Hessian, the down_proj check, the forward to the next block) then skip
    the mixer's QKV / attention / delta-rule work."""

    mixer: str                  # module whose output is replaced, e.g. "self_attn"
    linear: str                 # its last linear, e.g. "self_attn.o_proj"
    inputs: torch.Tensor        # [sequences, T, in] float32 on the host, as captured
    tuple_len: int | None       # the mixer returns a tuple of this length (None: a tensor)


class BlockRunner:
    """Runs block i (transformers' decoder layer, hf_layers.py) on the hidden states [N, T, d]
    (host tensors) in batches of `batch` sequences on the device, with weights w (short keys)."""

    def __init__(self, layers: HfLayers, batch: int):
        self.layers, self.batch, self.device = layers, batch, layers.device
        self._exact: dict[tuple[str, str], tuple[bool, int | None]] = {}

    def run(self, i: int, w: dict, xb: torch.Tensor, capture=None, stop_after=None,
            short: Shortcut | None = None, seqs: slice | None = None):
        """One batch already on the device (differentiable when called with grad enabled);
        with `short`, xb are the stream's sequences `seqs` and the mixer comes from the cache."""
        params = {HF_KEYS[k]: v for k, v in w.items()}
        replace = None
        if short is not None:
            def make(layer, short=short, seqs=seqs):
                a = short.inputs[seqs].to(self.device)
                # the module's own product, without its hooks: the cached inputs were captured
                # after the --rotate pre-hook, so they are rotated already
                lin = layer.get_submodule(short.linear)
                y = torch.nn.functional.linear(a, lin.weight, lin.bias)
                return y if short.tuple_len is None else (y,) + (None,) * (short.tuple_len - 1)
            replace = (short.mixer, make)
        return self.layers.forward(i, params, xb, capture, stop_after, replace)

    @torch.no_grad()
    def forward(self, i: int, w: dict, x: torch.Tensor, capture=None,
                short: Shortcut | None = None) -> torch.Tensor:
        out = torch.empty_like(x)
        for b in range(0, x.shape[0], self.batch):
            sl = slice(b, b + self.batch)
            out[sl] = self.run(i, w, x[sl].to(self.device), capture, short=short,
                               seqs=sl).to(out.device)
        return out

    @torch.no_grad()
    def activations(self, i: int, w: dict, x: torch.Tensor, wanted: str,
                    short: Shortcut | None = None, first: int = 0) -> torch.Tensor:
        """The activations `wanted` ([tokens, features], on the device) of hidden states x (one
        batch: the stream's sequences from `first` on, with `short`) in block i; the forward
        stops right after them."""
        mod = CAPTURE_MODULE[wanted]
        got = []
        self.run(i, w, x.to(self.device), lambda n, a: got.append(a) if n == mod else None, mod,
                 short, slice(first, first + x.shape[0]))
        return got[0]

    @torch.no_grad()
    def hessian(self, i: int, w: dict, x_all: torch.Tensor, wanted: str,
                short: Shortcut | None = None, keep: bool = False):
        """H = 2 X^T X / tokens (float32, on the device) of the activations `wanted` when
        running x_all through block i; with `keep`, (H, the activations [N, T, in] on the host,
        float32 as captured, for a Shortcut)."""
        H, n, kept = None, 0, None
        N, T = x_all.shape[:2]
        for b in range(0, N, self.batch):
            xb = x_all[b:b + self.batch]
            a = self.activations(i, w, xb, wanted, short, b)
            H = _gram_add(H, a)
            n += a.shape[0]
            if keep:
                if kept is None:
                    kept = torch.empty((N, T, a.shape[-1]), dtype=torch.float32)
                kept[b:b + xb.shape[0]] = a.reshape(xb.shape[0], T, -1).to("cpu")
        H = _symmetric(H, 2.0 / max(n, 1))
        return (H, kept) if keep else H

    @torch.no_grad()
    def shortcut(self, i: int, w: dict, x: torch.Tensor, wanted: str, inputs: torch.Tensor
                 ) -> Shortcut | None:
        """The Shortcut of block i's mixer from the cached inputs of its last linear (`wanted`,
        one of SHORTCUT_INPUTS), or None when it would not be exact: the first time a kind of
        mixer is met, one batch runs both ways and the block outputs must be equal bit for bit
        (a mixer that does more after its last linear is run in full, as before)."""
        linear = CAPTURE_MODULE[wanted]
        mixer = linear.rsplit(".", 1)[0]
        mod = self.layers.layers[i].get_submodule(mixer)
        kind = (type(mod).__name__, linear)
        if kind not in self._exact:
            xb = x[:self.batch].to(self.device)
            seen = []
            hook = mod.register_forward_hook(lambda m, args, out: seen.append(out))
            try:
                want = self.run(i, w, xb)
            finally:
                hook.remove()
            out = seen[0]
            tuple_len = len(out) if isinstance(out, tuple) else None
            trial = Shortcut(mixer, linear, inputs, tuple_len)
            got = self.run(i, w, xb, short=trial, seqs=slice(0, xb.shape[0]))
            self._exact[kind] = (torch.equal(got, want), tuple_len)
        ok, tuple_len = self._exact[kind]
        return Shortcut(mixer, linear, inputs, tuple_len) if ok else None

    @torch.no_grad()
    def stage_hessians(self, i: int, w: dict, x_all: torch.Tensor, wanted
                       ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """({name: H = 2 X^T X / tokens} for the activations in `wanted`, the block output),
        from ONE forward of x_all through block i."""
        mods = {CAPTURE_MODULE[k]: k for k in wanted}
        acc: dict[str, torch.Tensor] = {}
        n = {k: 0 for k in wanted}

        def cap(name, a):
            k = mods.get(name)
            if k is not None:
                acc[k] = _gram_add(acc.get(k), a)
                n[k] += a.shape[0]

        out = self.forward(i, w, x_all, cap)
        return {k: _symmetric(acc[k], 2.0 / max(n[k], 1)) for k in acc}, out


def _lossless_ternary(w: torch.Tensor, tier: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = grid(tier).group
    rows, cols = w.shape
    wg = w.reshape(rows, cols // g, g)
    s = wg.abs().amax(dim=2)
    pos = s[..., None] > 0
    codes = torch.where(pos, torch.round(wg / torch.where(pos, s[..., None], 1.0)), 0.0)
    return codes.to(torch.int8).reshape(rows, cols), s


def _to_device(arrays: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}


ENGINE_PENDING = {"qwen3_5_moe": "qwen35moe", "qwen3_5_moe_text": "qwen35moe"}


class Quantizer:
    def __init__(self, opts: QuantizeOptions, log=_stderr, loader_cls=BlockLoader):
        from ..convert.arch import family_for
        from ..convert.hf_reader import HfCheckpoint
        from .calibration import Tokenizer

        from .gguf_input import GgufCheckpoint, is_gguf_file

        self.opts, self.log = opts, log
        self.timer = Timer()
        self.device = resolve_device(opts.device)
        if is_gguf_file(opts.model_dir):
            self.ckpt = GgufCheckpoint(opts.model_dir)
            self.tokenizer_dir = self.ckpt.tokenizer_dir
            where = f"{opts.model_dir} (GGUF metadata)"
        else:
            self.ckpt = HfCheckpoint(opts.model_dir)
            self.tokenizer_dir = Path(opts.model_dir)
            where = str(Path(opts.model_dir) / "config.json")
        mt = self.ckpt.config.get("model_type")
        if mt in ENGINE_PENDING:
            raise BonsaiError(f"{where}: model_type {mt!r} ({ENGINE_PENDING[mt]} in GGUF) is not "
                              "supported yet: the engine cannot run it, so the quantizer refuses it "
                              "before any work; supported: llama, qwen2, qwen3, qwen3_5")
        self.family = family_for(self.ckpt.config, where)
        shapes = {n: self.ckpt.shape(n) for n in self.ckpt.tensor_names()}
        self.specs = self.family.validate_tensors(shapes, str(opts.model_dir))
        self.hp = self.family.hp
        self.forward_dtype = resolve_forward_dtype(opts.forward_dtype, self.device)
        self.forward_dtype_name = str(self.forward_dtype).removeprefix("torch.")
        self.layers = HfLayers(self.ckpt.config, self.device, where, self.forward_dtype)
        self.blocks = BlockRunner(self.layers, max(opts.batch_size, 1))
        self.tokenizer = Tokenizer(self.tokenizer_dir)
        self.policy = Policy(opts.group_size, opts.embed_type, tuple(parse_policy(opts.policy)))
        self.loader = loader_cls(self.ckpt)
        self.tier_plan: dict[str, tuple[str, str | None]] = {}
        out = Path(opts.output_dir)
        if out.exists() and not opts.force:
            raise BonsaiError(f"{out} already exists; pass --force to replace it")
        if opts.outfile and Path(opts.outfile).exists() and not opts.force:
            raise BonsaiError(f"{opts.outfile} already exists; pass --force to replace it")
        if opts.batch_size < 1:
            raise BonsaiError(f"--batch-size {opts.batch_size}: must be at least 1")
        if opts.calib_steps < 0 or opts.lr <= 0:
            raise BonsaiError("--calib-steps must be >= 0 and --lr > 0")
        if opts.ridge is not None and not opts.ridge >= 0:
            raise BonsaiError(f"--ridge {opts.ridge}: auto or a number >= 0")
        if opts.method not in METHODS:
            raise BonsaiError(f"--method {opts.method!r}: one of {', '.join(METHODS)}")
        if opts.method == "rtn" and (opts.sensitivity or opts.target_bpw is not None
                                     or opts.calib_steps or opts.calib_file):
            raise BonsaiError("--method rtn uses no calibration data: it cannot be combined with "
                              "--calib-file, --calib-steps, --sensitivity-analysis or --target-bpw")
        if opts.target_gain not in TARGET_GAINS:
            raise BonsaiError(f"target_gain {opts.target_gain!r}: one of {', '.join(TARGET_GAINS)}")
        if opts.refine_target not in ("float", "block"):
            raise BonsaiError(f"--refine-target {opts.refine_target!r}: float or block")
        if not 0.0 < opts.threshold <= 1.0:
            raise BonsaiError(f"--threshold {opts.threshold}: a cosine similarity in (0, 1]")
        if getattr(self.family, "prefix", "model.") != "model.":
            raise BonsaiError(f"{where}: a {self.ckpt.config.get('architectures', ['?'])[0]} "
                              "checkpoint (language model under model.language_model.*) is not "
                              "supported by the quantizer yet; save its text model as "
                              "Qwen3_5ForCausalLM (tensors under model.*) and quantize that")
        self.rotation = self._rotation(opts)
        if opts.equalize and self.family.gguf_arch == "qwen35":
            raise BonsaiError("--equalize is not supported for qwen35: its norms multiply by "
                              "(1 + w), which a channel scale cannot be folded into")
        self.types = {s.hf_name: self.policy.type_of(s.hf_name, len(s.shape)) for s in self.specs}
        for s in self.specs:
            t = self.types[s.hf_name][0]
            if t in QUANT_TIERS and s.shape[-1] % grid(t).group:
                raise BonsaiError(f"{s.hf_name}: {s.shape[-1]} input columns do not split into "
                                  f"groups of {grid(t).group} for {t.upper()}; give it another "
                                  "type with --policy")
            if t in QUANT_TIERS and s.cols_block and s.cols_block % grid(t).group:
                raise BonsaiError(
                    f"{s.hf_name}: the converter reorders its columns in blocks of "
                    f"{s.cols_block} (qwen35: whole V heads), which do not hold whole "
                    f"{t.upper()} groups of {grid(t).group}, so its packed groups cannot be "
                    "reordered exactly; give it another type with --policy (e.g. "
                    f"\"{s.hf_name.rsplit('.', 2)[-2]}=q8_0\")")
        # linear weights at a plain type by default (qwen35 in_proj_a/b) count at that type
        linear = [(s.hf_name, int(np.prod(s.shape)),
                   self.types[s.hf_name][0] if self.types[s.hf_name][1]
                   or self.types[s.hf_name][0] not in QUANT_TIERS else None)
                  for s in self.specs if s.role == "linear"]
        if opts.target_bpw is not None:
            check_target(opts.target_bpw, linear, self.policy.ternary)

    def _rotation(self, opts: QuantizeOptions):
        """The --rotate Rotation (rotation.py), installed into the layers, or None."""
        from .rotation import Rotation, choose_block, parse_rotate, rotated_names

        block = parse_rotate(opts.rotate)
        if block is None:
            return None
        if opts.rotate == "auto" and (self.family.gguf_arch == "qwen35" or opts.equalize
                                      or opts.method == "rtn"):
            why = ("--equalize" if opts.equalize else "--method rtn, the plain baseline"
                   if opts.method == "rtn" else "qwen35")
            self.log(f"--rotate auto: no rotation ({why} is quantized unrotated)")
            return None
        if self.family.gguf_arch == "qwen35":
            raise BonsaiError("--rotate is not supported for qwen35 yet (its Gated DeltaNet out_proj "
                              "columns are reordered by the converter); use --rotate none")
        if opts.equalize:
            raise BonsaiError("--rotate and --equalize cannot be combined: the channel scales would "
                              "have to be folded through the rotation; use one of them")
        widths = rotated_names(self.specs)
        try:
            block = choose_block(block, widths)
        except BonsaiError as e:
            if opts.rotate != "auto":
                raise
            self.log(f"--rotate auto: no rotation ({e})")
            return None
        rot = Rotation(block, opts.seed, self.device)
        self.layers.rotation = rot
        return rot

    def _rotated(self) -> list[str]:
        from .rotation import rotated_names

        return list(rotated_names(self.specs))

    def _block_weights(self, i: int, device) -> dict[str, torch.Tensor]:
        """Block i's tensors on the device (short keys), its linears rotated with --rotate."""
        w = _to_device(self.loader.load_block(i), device)
        return w if self.rotation is None else self.rotation.rotate_block(w)

    # ----- already-ternary weights -----

    def scan_ternary(self) -> dict[str, str]:
        """hf name -> ternary tier for linear weights that are exactly ternary (lossless)."""
        from ..convert.ternary import best_ternary_type, looks_ternary, ternary_groups

        found = {}
        for s in self.specs:
            if (s.role != "linear" or self.types[s.hf_name][1]
                    or self.types[s.hf_name][0] not in QUANT_TIERS):
                continue
            if not looks_ternary(self._sample_rows(s.hf_name)):
                continue
            groups = ternary_groups(self.ckpt.read_float32(s.hf_name))
            t = best_ternary_type(groups)
            if t is not None:
                found[s.hf_name] = t
        return found

    def _sample_rows(self, name: str, rows: int = 8) -> np.ndarray:
        """The first rows of a tensor as float32, read from the mapping (not the whole tensor)."""
        from ..convert.safetensors_file import bf16_bits_to_float32
        from ..mapped_pages import release

        if hasattr(self.ckpt, "sample_rows"):
            return self.ckpt.sample_rows(name, rows)
        full = self.ckpt.read_raw(name)
        raw = full[:rows]
        out = bf16_bits_to_float32(raw) if self.ckpt.dtype(name) == "BF16" else np.array(raw, dtype=np.float32)
        # The page faults also mapped the kernel's read-around beyond these rows: drop the
        # tensor's pages, or the scan alone would keep ~100 KiB per tensor of every block resident.
        release(full)
        return out

    # ----- main loop -----

    def run(self) -> dict:
        from ..convert.ptq1_dir import Ptq1DirWriter, summarize
        from tqdm import tqdm

        o = self.opts
        t_start = time.perf_counter()
        self.log(f"computing on {self.device} with torch {torch.__version__} (float32; calibration "
                 f"forward in {self.forward_dtype_name}; {torch.get_num_threads()} CPU threads)")
        with self.timer("ternary scan"):
            lossless = self.scan_ternary()
        if lossless and self.rotation is not None and o.rotate == "auto":
            self.log("--rotate auto: no rotation (the checkpoint has already-ternary weights, "
                     "packed as they are)")
            self.rotation = self.layers.rotation = None
        if lossless and self.rotation is not None:
            raise BonsaiError(f"--rotate: {len(lossless)} linear weights are already ternary (e.g. "
                              f"{next(iter(lossless))}); rotating them would lose that exact form. "
                              "Quantize without --rotate")
        if self.rotation is not None:
            self.log(f"--rotate: Hadamard rotation, block {self.rotation.block}, signs seeded with "
                     f"--seed {o.seed}, folded into {len(self._rotated())} linear weights")
        n_linear = sum(1 for s in self.specs
                       if s.role == "linear" and self.types[s.hf_name][0] in QUANT_TIERS)
        calib = None
        if o.method == "rtn":
            self.log("--method rtn: round-to-nearest (absmean threshold), no calibration data")
        elif len(lossless) < n_linear:
            from .calibration import BUILTIN_SOURCE, load_calibration

            if o.calib_file is None:
                self.log(f"no --calib-file: using the {BUILTIN_SOURCE} calibration set")
            calib = load_calibration(o.calib_file, self.tokenizer, o.seq_len, o.max_samples,
                                     o.seed, self.hp.n_vocab)
            cs = calib.summary()
            self.log(f"calibration: {cs['samples']} samples, {cs['tokens_available']} tokens -> "
                     f"{cs['sequences']} sequences x {cs['seq_len']} tokens; domains "
                     + ", ".join(f"{k} {v:.0%}" for k, v in cs["domains"].items()))
            if "parts" in cs:
                self.log("built-in set parts (share of tokens): " + ", ".join(
                    f"{k} {v['samples']} samples {v['share']:.0%}" for k, v in cs["parts"].items()))
            for wmsg in calib.warnings:
                self.log(f"warning: {wmsg}")
        elif lossless:
            self.log(f"all {n_linear} linear weights are already ternary: packing them losslessly "
                     "without calibration")
        summary_cal = (calib.summary() if calib else {"method": "rtn"} if o.method == "rtn"
                       else {"lossless_ternary": True})
        if hasattr(self.ckpt, "describe"):
            summary_cal["model_source"] = self.ckpt.describe()
        self.tier_plan = {}
        if o.target_bpw is not None and calib is not None:
            self.tier_plan = self._plan_target_bpw(calib, lossless, tqdm)
        with Ptq1DirWriter(o.output_dir, self.ckpt.config, tokenizer_dir=self.tokenizer_dir,
                           scheme=self.policy.ternary, calibration=summary_cal,
                           rotation=(self.rotation.describe(self._rotated())
                                     if self.rotation is not None else None),
                           force=o.force) as writer:
            report = self._quantize_all(writer, calib, lossless, tqdm)
            if "sensitivity" in report:
                summary_cal["sensitivity"] = report["sensitivity"]
            report["timing"] = self._timing(t_start)
            summary_cal["compute"] = report["timing"]
            writer.calibration = summary_cal
            summary = summarize(writer.records)
            records = list(writer.records)
        self._print_table(records, summary, report)
        result = {"output_dir": str(Path(o.output_dir)), "summary": summary, "report": report}
        if o.outfile:
            from ..convert import convert

            convert(o.output_dir, o.outfile, "auto", force=o.force, progress=o.progress,
                    log=self.log)
            result["outfile"] = str(o.outfile)
        return result

    def _quantize_all(self, writer, calib, lossless, tqdm) -> dict:
        o, hp, tm, dev = self.opts, self.hp, self.timer, self.device
        by_block: dict[int, list] = {}
        head_specs = []
        for s in self.specs:
            if s.hf_name.startswith("model.layers."):
                by_block.setdefault(int(s.hf_name.split(".")[2]), []).append(s)
            else:
                head_specs.append(s)
        embed_name = "model.embed_tokens.weight"
        with tm("load"):
            embed = torch.from_numpy(self.loader.read(embed_name))
        with tm("write"):
            embed_q = self._write_2d(writer, embed_name, embed, self.types[embed_name][0],
                                     "token embedding")
        x = heldout = None
        if calib is not None:
            tokens = calib.tokens
            if o.sensitivity:
                tokens, held = held_out_split(tokens, o.held_out)
                if tokens is calib.tokens:
                    self.log("warning: only one calibration sequence: the held-out loss is "
                             "measured on calibration text")
                heldout = HeldOut(held, embed, embed_q)
            x = embed_q[torch.from_numpy(tokens.astype(np.int64))]
        # the float model's hidden states, the refinement's target (refine.py)
        x_fp = None
        if x is not None and ((o.calib_steps > 0 and o.refine_target == "float")
                              or o.float_target):
            x_fp = embed[torch.from_numpy(tokens.astype(np.int64))]
        del embed, embed_q
        reports = []
        run = self.blocks
        bar = tqdm(range(hp.n_layer), desc=f"quantizing blocks on {dev}", unit="block",
                   disable=not o.progress, file=sys.stderr)
        for i in bar:
            with tm("load"):
                w = self._block_weights(i, dev)
            rep, qw, stored, short = self._quantize_block(i, w, x, lossless,
                                                          x_fp if o.float_target else None)
            if x_fp is not None:
                with tm("forward"):
                    x_fp = run.forward(i, w, x_fp)
            if x is not None and o.calib_steps > 0:
                from .refine import refine_block

                self.log(f"blk.{i}: reconstructing the block's scales ({o.calib_steps} Adam "
                         f"steps, lr {o.lr}, batch {o.batch_size})")
                short = None            # the refined q/k/v change the cached mixer inputs
                with tm("refine"):
                    target = x_fp if x_fp is not None else run.forward(i, w, x)
                    rep.refine = refine_block(x, target, lambda ww, xb, i=i: run.run(i, ww, xb),
                                              stored, qw, o.calib_steps, o.lr, o.batch_size,
                                              o.seed, log=self.log)
                    del target
                r = rep.refine
                self.log(f"blk.{i}: reconstruction over {o.calib_steps} steps, held-out block "
                         f"output error {r['before']:.5f} -> {r['after']:.5f}"
                         + (f" (best at step {r['best_step']})" if r["kept"]
                            else " (not better: GPTQ's scales kept)"))
            with tm("write"):
                for s in by_block[i]:
                    key = next(k for k, hf in HF_KEYS.items() if s.hf_name.endswith("." + hf))
                    if key in stored:
                        res, info = stored[key]
                        codes, scales = res.arrays()
                        writer.add_quantized(s.hf_name, res.tier, codes, scales,
                                             cosine=info.get("cosine"), rel_err=info.get("rel_err"),
                                             fallback_reason=info.get("reason"))
                    else:
                        t = self.types[s.hf_name][0]
                        # a copy: the writer's shard buffer must not keep the loaded block alive
                        a = qw[key].detach().to("cpu").numpy().copy()
                        writer.add_plain(s.hf_name, a, "F32" if a.ndim < 2 else t.upper(),
                                         fallback_reason=(f"policy: kept at {t.upper()}"
                                                          if a.ndim == 2 else None))
            with tm("forward"):
                if x is not None:
                    x = run.forward(i, qw, x, short=short)
                if heldout is not None:
                    heldout.step(i, lambda h, w=w, i=i: run.forward(i, w, h),
                                 lambda h, qw=qw, i=i: run.forward(i, qw, h))
            reports.append(rep)
            del w, qw, stored, short
        bar.close()
        with tm("write"):
            for s in head_specs:
                if s.hf_name == embed_name:
                    continue
                t = self.types[s.hf_name][0]
                data = self.loader.read(s.hf_name)
                if len(s.shape) == 2:
                    self._write_2d(writer, s.hf_name, torch.from_numpy(data), t, "output head")
                else:
                    writer.add_plain(s.hf_name, data.copy(), "F32")
        out = {"blocks": [{"block": r.index, "layers": r.layers, "refine": r.refine}
                          for r in reports]}
        if heldout is not None:
            with tm("sensitivity"):
                out["sensitivity"] = self._block_losses(heldout, writer)
        return out

    def _write_2d(self, writer, name, data: torch.Tensor, t, what) -> torch.Tensor:
        """Writes embedding/head `name` (a host tensor) at type t; returns the values as stored
        (float32, on the host)."""
        if t in QUANT_TIERS:
            res = LayerResult(t, *(quantize_rtn(data, grid(t)) if grid(t).ternary
                                   else reference_codes(data, t)), None, None, None)
            reason = None if grid(t).ternary else f"{what} at {t.upper()} (--embed-type/--policy)"
            writer.add_quantized(name, t, *res.arrays(), fallback_reason=reason)
            return res.dequantize()
        writer.add_plain(name, data.numpy(), t.upper(), fallback_reason=f"{what} kept at {t.upper()}")
        if t == "f16":
            return data.to(torch.float16).to(torch.float32)
        if t == "bf16":
            return data.to(torch.bfloat16).to(torch.float32)
        return data

    # ----- one block -----

    def _block_tiers(self, i) -> tuple[dict[str, str], dict[str, str]]:
        """key -> type for block i's linears, and key -> reason for --target-bpw promotions."""
        tiers, reasons = {}, {}
        for key in LINEARS:
            name = f"model.layers.{i}.{HF_KEYS[key]}"
            if name not in self.types:          # not a tensor of this kind of layer
                continue
            tiers[key] = self.types[name][0]
            if name in self.tier_plan:
                tiers[key], why = self.tier_plan[name]
                if why:
                    reasons[key] = why
        return tiers, reasons

    def _plan_target_bpw(self, calib, lossless, tqdm) -> dict[str, tuple[str, str | None]]:
        """--target-bpw: a float pre-pass over the blocks (one at a time: one forward per batch
        gives the block's stage Hessians and the next block's input) estimates every unpinned
        linear layer's relative output error at every tier by the plain fit (no GPTQ:
        gptq.plain_fit_errors, policy.py says why that ranks the tiers well enough), unweighted
        or weighted by its float output energy (opts.target_gain); then one global greedy promotion
        (policy.promote_to_target). Returns hf name -> (tier, reason or None)."""
        o = self.opts
        chain = promotion_chain(self.policy.ternary)
        embed = torch.from_numpy(self.loader.read("model.embed_tokens.weight"))
        x = embed[torch.from_numpy(calib.tokens.astype(np.int64))]
        del embed
        fisher = o.target_gain == "fisher"
        n_f = fisher_sequences(*calib.tokens.shape[:2]) if fisher else 0
        kept: list[torch.Tensor] = []        # the Fisher sequences' block inputs
        items, row_errs = {}, {}
        bar = tqdm(range(self.hp.n_layer), desc=f"estimating tiers (--target-bpw) on {self.device}",
                   unit="block", disable=not o.progress, file=sys.stderr)
        for i in bar:
            w = self._block_weights(i, self.device)
            todo = {}
            for key in LINEARS:
                name = f"model.layers.{i}.{HF_KEYS[key]}"
                if name not in self.types:
                    continue
                t, pin = self.types[name]
                todo[key] = (name, t if pin or t not in QUANT_TIERS else lossless.get(name))
            wanted = {INPUT_OF[k] for k, (_, fixed) in todo.items() if not fixed}
            if fisher:
                kept.append(x[:n_f].to(keep_dtype(self.hp.n_layer, x[:n_f]), copy=True))
            with self.timer("target-bpw pre-pass"):
                Hs, x = self.blocks.stage_hessians(i, w, x, wanted)
                for key, (name, fixed) in todo.items():
                    err, energy, rows = (({}, 1.0, {}) if fixed
                                         else plain_fit_row_errors(w[key], Hs[INPUT_OF[key]], chain))
                    items[name] = {"params": w[key].numel(), "pinned": fixed, "err": err,
                                   "weight": energy if o.target_gain == "output" else 1.0}
                    if fisher and not fixed:
                        row_errs[name] = (i, key, rows)
            del w, Hs
        bar.close()
        if fisher:
            self._fisher_losses(items, row_errs, kept, x[:n_f], calib.tokens[:n_f], tqdm)
        del x, kept
        choice = promote_to_target(o.target_bpw, items, self.policy.ternary)
        base = self.policy.ternary
        plan = {}
        for name, t in choice.items():
            it = items[name]
            why = None
            if it["pinned"] is None and t != base:
                why = (f"target-bpw {o.target_bpw}: promoted to {t.upper()} (plain-fit rel err "
                       f"{it['err'][base]:.4f} at {base.upper()} -> {it['err'][t]:.4f}"
                       + (f"; predicted loss +{it['loss'][base]:.4f} -> +{it['loss'][t]:.4f} "
                          "nats/token" if "loss" in it else "") + ")")
            plan[name] = (t, why)
        n_up = sum(1 for _, why in plan.values() if why)
        gain = {"fisher": "predicted loss increase (output-channel Fisher)",
                "relative": "relative output error", "output": "output error"}[o.target_gain]
        self.log(f"--target-bpw {o.target_bpw}: {n_up} of {len(plan)} linear tensors promoted "
                 f"above {base.upper()} (gain: {gain} per bit)")
        if fisher:
            pred = sum(items[n]["loss"][t] for n, t in choice.items() if "loss" in items[n])
            self.log(f"--target-bpw {o.target_bpw}: predicted loss increase of the plan, plain "
                     f"fits, layers added up: +{pred:.4f} nats/token (GPTQ lowers it)")
        return plan

    def _fisher_losses(self, items, row_errs, kept, final_hidden, tokens, tqdm) -> None:
        """items[name]["loss"] = {tier: predicted loss increase} from the float model's
        output-channel Fisher (fisher.py) and the pre-pass's per-row plain-fit errors."""
        o, hp = self.opts, self.hp
        keys: dict[int, list[str]] = {}         # block -> the linears whose Fisher is wanted
        for i, key, _ in row_errs.values():
            keys.setdefault(i, []).append(key)
        norm_w = torch.from_numpy(self.loader.read("model.norm.weight")).to(self.device)
        head = torch.from_numpy(self.loader.read("model.embed_tokens.weight" if hp.tied
                                                 else "lm_head.weight")).to(self.device)
        bar = tqdm(total=hp.n_layer, desc=f"output Fisher (backward, {tokens.size} tokens)",
                   unit="block", disable=not o.progress, file=sys.stderr)
        with self.timer("target-bpw fisher"):
            F, loss = output_fisher(self.blocks, hp.n_layer,
                                    lambda i: self._block_weights(i, self.device), kept,
                                    final_hidden, tokens, lambda h: self.layers.final_norm(norm_w, h),
                                    head, lambda i: keys.get(i, []), lambda i: bar.update(1))
        bar.close()
        del head
        n_tok = int(tokens.size)          # the Fisher sums over every position
        for name, (i, key, rows) in row_errs.items():
            f = F[(i, key)].to(self.device)
            step = -(-f.shape[0] // ESTIMATE_ROWS)
            items[name]["loss"] = {t: predicted_loss(r, f[::step], n_tok) for t, r in rows.items()}
        self.log(f"output Fisher on {n_tok} tokens (the float model's loss on them: {loss:.4f} "
                 "nats/token)")

    def _store_q8(self, i, key, w, qw, stored, rep, x, reason, pinned, short=None) -> None:
        """A Q8_0 layer by the reference block quantizer; cosine / relative output error are
        measured on the layer's inputs of the first calibration sequences (up to 1024 tokens)."""
        codes, scales = reference_codes(w[key], "q8_0")
        res = LayerResult("q8_0", codes, scales, None, None, None)
        q = res.dequantize()
        n_seq = max(1, min(x.shape[0], 1024 // max(x.shape[1], 1)))
        a = self.blocks.activations(i, qw, x[:n_seq], INPUT_OF[key], short)
        # float32 products (the float64 ones cost ~1 s a block); the error from the difference
        # of the weights, not of two near-equal outputs; sums in float64
        y, ye = a @ w[key].T, a @ (w[key] - q).T
        yy, ee, ye_ = (float(torch.linalg.vecdot(u, v, dim=-1).sum(dtype=torch.float64))
                       for u, v in ((y, y), (ye, ye), (y, ye)))
        qq = yy - 2.0 * ye_ + ee
        cos = (yy - ye_) / float(np.sqrt(yy * qq)) if yy > 0 and qq > 0 else 1.0
        rel = float(np.sqrt(ee / max(yy, 1e-300)))
        if reason is None and not pinned:
            reason = "default policy: down_proj kept at Q8_0" if key == "down" else None
        elif pinned and reason is None:
            reason = "policy: Q8_0"
        stored[key] = (res, {"cosine": cos, "rel_err": rel, "reason": reason})
        qw[key] = q
        rep.layers[key] = {"tier": "q8_0", "err": rel, "cosine": cos, "method": "reference"}
        self.log(f"blk.{i} {HF_KEYS[key].split('.')[-2]:>9} q8_0   rel. output error: reference "
                 f"rounding {rel:.4f}  (cosine {cos:.4f}, {a.shape[0]} tokens)")

    def _cross_of(self, i, x, x_fp, qw, w, wanted) -> torch.Tensor:
        """C = 2 X_fp^T X_q / tokens: the float model's and the quantized stream's inputs of the
        layers fed by `wanted`, captured by running both block versions on the same sequences."""
        o = self.opts
        acc, n = None, 0
        for b in range(0, x.shape[0], o.batch_size):
            xq = self.blocks.activations(i, qw, x[b:b + o.batch_size], wanted)
            xf = self.blocks.activations(i, w, x_fp[b:b + o.batch_size], wanted)
            acc = xf.T @ xq if acc is None else acc.addmm_(xf.T, xq)
            n += xq.shape[0]
        return acc * (2.0 / max(n, 1))

    def _float_target(self, w_key, H, C) -> torch.Tensor:
        """W_eff = W C (H + damp)^-1: GPTQ on W_eff with H minimizes ||X_fp W^T - X_q Q^T||, the
        distance to the float model's layer output (not to W on the quantized stream). Solved in
        float64 (H's condition number, as in gptq.py)."""
        Hd = H.double().clone()
        Hd.diagonal().add_(self.opts.damp * float(torch.diagonal(Hd).mean()) + 1e-12)
        wc = w_key.double() @ C.double()
        return torch.linalg.solve(Hd, wc.T).T.to(w_key.dtype)

    def _quantize_block(self, i, w, x, lossless, x_fp=None):
        o = self.opts
        rep = BlockReport(i)
        qw = dict(w)
        stored: dict[str, tuple[LayerResult, dict]] = {}
        tiers, reasons = self._block_tiers(i)
        short = None             # the mixer's output from cached inputs, once they are known
        for stage in STAGES:
            H = Hq = C = prep = kept = None
            for key in stage:
                if key not in w:                # not a tensor of this kind of layer
                    continue
                name = f"model.layers.{i}.{HF_KEYS[key]}"
                pinned = self.types[name][1]
                t = tiers[key]
                if name in lossless and not pinned:
                    tt = lossless[name]
                    codes, scales = _lossless_ternary(w[key], tt)
                    res = LayerResult(tt, codes, scales, 0.0, 0.0, 0.0)
                    stored[key] = (res, {"cosine": 1.0, "rel_err": 0.0})
                    qw[key] = res.dequantize()
                    rep.layers[key] = {"tier": tt, "lossless": True}
                    continue
                if t not in QUANT_TIERS:
                    qw[key] = self._plain_values(w[key], t)
                    continue
                if o.method == "rtn":
                    codes, scales = (quantize_absmean(w[key], grid(t)) if grid(t).ternary
                                     else reference_codes(w[key], t) if t in ("q4_0", "q8_0")
                                     else quantize_rtn(w[key], grid(t)))
                    res = LayerResult(t, codes, scales, None, None, None)
                    reason = None if grid(t).ternary else (
                        "default policy: down_proj kept at Q8_0" if t == "q8_0" and not pinned
                        else f"policy: {t.upper()}")
                    stored[key] = (res, {"reason": reason})
                    qw[key] = res.dequantize()
                    rep.layers[key] = {"tier": t, "method": "rtn"}
                    continue
                if t == "q8_0":
                    # Q8_0 is within ~0.5% of the float output with plain rounding: the
                    # reference blocks, no Hessian (4864^2 for a down_proj) and no GPTQ, also
                    # in a stage whose other layers need one (q/k/v, gate/up promoted by
                    # --target-bpw: GPTQ's 0.003 -> 0.0015 is ~100x below the ternary layers'
                    # errors; skipping it took the demo's quantization from 505 s to 458 s, PPL ratio
                    # 1.25 -> 1.21, i.e. the same)
                    with self.timer("gptq"):
                        self._store_q8(i, key, w, qw, stored, rep, x, reasons.get(key), pinned,
                                       short)
                    continue
                if H is None:
                    with self.timer("hessian"):
                        if INPUT_OF[key] in SHORTCUT_INPUTS and not o.equalize:
                            H, kept = self.blocks.hessian(i, qw, x, INPUT_OF[key], short, True)
                        else:
                            H = self.blocks.hessian(i, qw, x, INPUT_OF[key], short)
                    if o.equalize:
                        H = self._equalize(i, stage, w, qw, stored, H, tiers, lossless)
                    ridge = (o.ridge if o.ridge is not None else
                             auto_ridge(H.shape[0], x.shape[0] * x.shape[1], o.damp))
                    Hq = with_ridge(H, ridge)
                target = w[key]
                if x_fp is not None and grid(t).ternary:
                    with self.timer("hessian"):
                        if C is None:
                            C = self._cross_of(i, x, x_fp, qw, w, INPUT_OF[key])
                        target = self._float_target(w[key], H, C)
                with self.timer("gptq"):
                    if prep is None:
                        prep = prepare_hessian(Hq, o.damp, target.dtype)
                    res = quantize_layer(target, Hq, t, o.damp, prep)
                    cos, rel = (res.cosine, res.err) if target is w[key] and Hq is H else \
                        output_metrics(w[key], res.dequantize(), H)
                reason = reasons.get(key)
                if t == "q8_0" and reason is None and not pinned:
                    reason = "default policy: down_proj kept at Q8_0"
                elif pinned and t != self.policy.ternary:
                    reason = f"policy: {t.upper()}"
                if (o.sensitivity and not pinned and grid(t).ternary and cos < o.threshold):
                    reason = (f"cosine {cos:.4f} < {o.threshold} at {t.upper()}: fell back to "
                              "Q8_0")
                    first = {"tier": t, "cosine": cos, "rel_err": rel}
                    with self.timer("gptq"):
                        res = quantize_layer(w[key], Hq, "q8_0", o.damp, prep)
                        cos, rel = output_metrics(w[key], res.dequantize(), H)
                    rep.layers.setdefault("fallback", {})[key] = first
                stored[key] = (res, {"cosine": cos, "rel_err": rel, "reason": reason})
                qw[key] = res.dequantize()
                rep.layers[key] = {"tier": res.tier, "err_plain": res.err_plain,
                                   "err_gptq": res.err_gptq, "err": rel, "cosine": cos,
                                   "ridge": ridge}
                self.log(f"blk.{i} {HF_KEYS[key].split('.')[-2]:>9} {res.tier:<6} rel. "
                         f"error (objective, ridge {ridge:.3g}): plain {res.err_plain:.4f}  gptq "
                         f"{res.err_gptq:.4f}  final {res.err:.4f}; output {rel:.4f} (cosine "
                         f"{cos:.4f})")
            if kept is not None:         # the stage's linear is final now
                with self.timer("hessian"):
                    short = self.blocks.shortcut(i, qw, x, INPUT_OF[stage[0]], kept)
        for key in w:
            if key not in LINEARS:
                qw[key] = w[key]
        return rep, qw, stored, short

    def _equalize(self, i, stage, w, qw, stored, H, tiers, lossless) -> torch.Tensor:
        """Channel scaling of one stage (equalize.py); updates w / qw / stored, returns H'."""
        from .equalize import choose_scales, o_tie_groups, v_row_scales
        from .ternary_fit import to_fp16

        names = {k: f"model.layers.{i}.{HF_KEYS[k]}" for k in stage}
        if any(not grid(tiers[k]).ternary if tiers[k] in QUANT_TIERS else True for k in stage) \
                or any(names[k] in lossless or self.types[names[k]][1] for k in stage):
            return H
        hp = self.hp
        producer = {"o": "v", "down": "up"}.get(stage[0])
        if producer is not None and (producer not in stored
                                     or not grid(stored[producer][0].tier).ternary):
            return H
        tie = o_tie_groups(hp.n_head, hp.n_head_kv, hp.head_dim) if stage[0] == "o" else None
        s, alpha, e0, e1 = choose_scales([w[k] for k in stage], H, tiers[stage[0]], tie)
        if alpha == 0.0:
            return H
        for k in stage:
            w[k] = w[k] * s
        if producer is None:
            norm = "attn_norm" if stage[0] == "q" else "ffn_norm"
            w[norm] = w[norm] / s
            qw[norm] = w[norm]
        else:
            d = (v_row_scales(s, hp.n_head, hp.n_head_kv, hp.head_dim) if producer == "v"
                 else s).double()
            res = stored[producer][0]
            res.scales = to_fp16(res.scales.double() / d[:, None]).to(res.scales.dtype)
            qw[producer] = res.dequantize()
            w[producer] = (w[producer] / d[:, None]).to(torch.float32)
            bias = producer + "_bias"
            if bias in w:
                w[bias] = (w[bias] / d).to(torch.float32)
                qw[bias] = w[bias]
        self.log(f"blk.{i} {'/'.join(stage):>9} channel scaling alpha {alpha:.2f}: plain-fit "
                 f"error {e0:.4f} -> {e1:.4f}")
        return H / torch.outer(s, s)

    @staticmethod
    def _plain_values(a: torch.Tensor, t: str) -> torch.Tensor:
        if t == "f16":
            return a.to(torch.float16).to(torch.float32)
        return a

    # ----- held-out loss and the report -----

    def _block_losses(self, heldout: HeldOut, writer) -> dict:
        dev = self.device
        norm_w = torch.from_numpy(self.loader.read("model.norm.weight")).to(dev)
        head = torch.from_numpy(self.loader.read("model.embed_tokens.weight" if self.hp.tied
                                                 else "lm_head.weight")).to(dev)

        def load_fp(j):
            w = self._block_weights(j, dev)
            return lambda h: self.blocks.forward(j, w, h)

        res = heldout.losses(self.hp.n_layer, load_fp,
                             lambda h: self.layers.final_norm(norm_w, h), head)
        for r in writer.records:
            if r.tensor.startswith("model.layers.") and len(r.shape) == 2:
                r.loss_delta = float(res["block_loss_delta"][int(r.tensor.split(".")[2])])
        return {"held_out_sequences": int(heldout.tokens.shape[0]),
                "held_out_tokens": int(heldout.tokens.size),
                "loss_fp": res["loss_fp"], "loss_quantized": res["loss_quantized"],
                "block_loss_delta": {str(k): v for k, v in res["block_loss_delta"].items()}}

    def _timing(self, t_start: float) -> dict:
        """{device, seconds per stage, total seconds}; printed as one line."""
        total = time.perf_counter() - t_start
        sec = {k: round(v, 3) for k, v in self.timer.seconds.items()}
        self.log(f"time on {self.device}: " + ", ".join(f"{k} {v:.1f} s" for k, v in sec.items())
                 + f"; total {total:.1f} s (before the GGUF conversion)")
        return {"device": str(self.device), "torch": torch.__version__,
                "forward_dtype": self.forward_dtype_name, "seconds": sec,
                "total_seconds": round(total, 3)}

    def _print_table(self, records, summary, report) -> None:
        rows = [r for r in records if r.fallback_reason]
        self.log(f"fallback layer table ({len(rows)} tensor(s) kept above "
                 f"{self.policy.ternary.upper()}):")
        self.log(f"  {'tensor':<44} {'type':<7} {'cosine':>7} {'rel_err':>8} {'loss_d':>8}  reason")
        for r in rows:
            def f(v, w=7):
                return f"{v:>{w}.4f}" if v is not None else " " * (w - 1) + "-"
            self.log(f"  {r.tensor:<44} {r.dtype.upper():<7} {f(r.cosine)} {f(r.rel_err, 8)} "
                     f"{f(r.loss_delta, 8)}  {r.fallback_reason}")
        self.log(f"bits per weight (scales included): linear layers {summary['bpw_linear']:.4f}, "
                 f"whole file {summary['bpw_file']:.4f}; tensors by type: "
                 + ", ".join(f"{k.upper()} {v}" for k, v in sorted(summary['tensors_by_type'].items())))
        sens = report.get("sensitivity")
        if sens:
            self.log(f"held-out loss ({sens['held_out_tokens']} tokens): float "
                     f"{sens['loss_fp']:.4f}, quantized {sens['loss_quantized']:.4f}")


def quantize_model(opts: QuantizeOptions, log=_stderr, loader_cls=BlockLoader) -> dict:
    """Runs the quantizer; result["output_dir"] is None when only opts.outfile was asked for."""
    if not opts.output_dir:
        if not opts.outfile:
            raise BonsaiError("nothing to write: give --output-dir (the PTQ1_0 directory), "
                              "--outfile (the GGUF file), or both")
        return _quantize_to_file_only(opts, log, loader_cls)
    q = Quantizer(opts, log, loader_cls)
    try:
        return q.run()
    finally:
        if hasattr(q.ckpt, "close"):
            q.ckpt.close()


def _quantize_to_file_only(opts: QuantizeOptions, log, loader_cls) -> dict:
    """--outfile without --output-dir: the PTQ1_0 directory goes to a temporary directory beside
    the GGUF (same file system, which may have room where /tmp has none), removed at the end;
    the GGUF itself is still written to a temporary name and renamed when complete."""
    import dataclasses
    import shutil
    import tempfile

    outfile = Path(opts.outfile)
    if outfile.is_dir():
        raise BonsaiError(f"--outfile {outfile} is a directory; give the path of the .gguf file to write")
    parent = outfile.parent
    if not parent.is_dir():
        raise BonsaiError(f"--outfile {outfile}: directory {parent} does not exist; create it first")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{outfile.name}.ptq1-", dir=parent))
    except OSError as e:
        raise BonsaiError(f"--outfile {outfile}: cannot create a temporary directory in {parent} "
                          f"({e.strerror or e}); pass --output-dir DIR for the PTQ1_0 directory") from None
    try:
        result = quantize_model(dataclasses.replace(opts, output_dir=str(tmp / "ptq1")), log, loader_cls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["output_dir"] = None
    return result


__all__ = ["QuantizeOptions", "BlockLoader", "Quantizer", "quantize_model"]
