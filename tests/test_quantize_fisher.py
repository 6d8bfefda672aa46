"""The output-channel Fisher of --target-bpw's Fisher gain (quantize/fisher.py).

Oracle: transformers' whole model (AutoModelForCausalLM.from_pretrained on the tiny checkpoint),
one backward of the summed next-token cross-entropy, the squared gradients at every linear
module's output summed over tokens. The quantizer computes the same thing block by block from
kept block inputs; the two must agree. Then the prediction is checked against the KL divergence
it predicts, and a --target-bpw run with the Fisher gain reaches its budget.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_factory import make_hf_model, write_calibration

from bonsai_runner.quantize import QuantizeOptions, quantize_model
from bonsai_runner.quantize.calibration import Tokenizer, load_calibration
from bonsai_runner.quantize.fisher import HEAD_CHUNK, output_fisher, predicted_loss
from bonsai_runner.quantize.hf_layers import HF_KEYS, HfLayers
from bonsai_runner.quantize.pipeline import BlockLoader, BlockRunner

SMALL = dict(hidden=128, ffn=256, n_layer=3, n_head=4, n_head_kv=2)
KEYS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp("fisher") / "m", arch=request.param,
                         tokenizer="bpe", seed=7, dtype="float32", tied=request.param == "qwen2",
                         **SMALL)


@pytest.fixture(scope="module")
def calib(model, tmp_path_factory):
    from bonsai_runner.convert.arch import family_for
    from bonsai_runner.convert.hf_reader import HfCheckpoint

    f = write_calibration(tmp_path_factory.mktemp("calib") / "calib.jsonl")
    ck = HfCheckpoint(model["dir"])
    fam = family_for(ck.config, "config.json")
    return ck, load_calibration(f, Tokenizer(model["dir"]), 24, 5, 0, fam.hp.n_vocab), f


def _ours(model, calib, seed=0):
    ck, cal, _ = calib
    loader = BlockLoader(ck)
    layers = HfLayers(ck.config, torch.device("cpu"))
    run = BlockRunner(layers, 2)
    n_layer = layers.n_layer
    blocks = [{k: torch.from_numpy(v) for k, v in loader.load_block(i).items()}
              for i in range(n_layer)]
    x = torch.from_numpy(loader.read("model.embed_tokens.weight")[cal.tokens])
    inputs = []
    for i in range(n_layer):
        inputs.append(x.clone())
        x = run.forward(i, blocks[i], x)
    norm = torch.from_numpy(loader.read("model.norm.weight"))
    head = torch.from_numpy(loader.read("model.embed_tokens.weight" if ck.config.get(
        "tie_word_embeddings") else "lm_head.weight"))
    return output_fisher(run, n_layer, lambda i: blocks[i], inputs, x, cal.tokens,
                         lambda h: layers.final_norm(norm, h), head, lambda i: list(KEYS),
                         seed=seed)


def _transformers(model, calib, F_seed=0):
    """The oracle: transformers' whole model, labels drawn as the quantizer draws them."""
    from transformers import AutoModelForCausalLM

    _, cal, _ = calib
    m = AutoModelForCausalLM.from_pretrained(str(model["dir"]), torch_dtype=torch.float32,
                                             attn_implementation="sdpa")
    acc, hooks = {}, []
    for i, layer in enumerate(m.model.layers):
        for k in KEYS:
            mod = layer.get_submodule(HF_KEYS[k].rsplit(".", 1)[0])

            def fwd(mod, args, y, key=(i, k)):
                y.register_hook(lambda g, key=key: acc.__setitem__(
                    key, acc.get(key, 0) + g.reshape(-1, g.shape[-1]).pow(2).sum(0)))
            hooks.append(mod.register_forward_hook(fwd))
    tok = torch.from_numpy(cal.tokens.astype(np.int64))
    logits = m(input_ids=tok).logits
    gen = torch.Generator().manual_seed(F_seed)
    labels = []
    for n in range(tok.shape[0]):            # the same draws in the same order as fisher.py
        for t0 in range(0, tok.shape[1], HEAD_CHUNK):
            p = torch.softmax(logits[n, t0:t0 + HEAD_CHUNK].detach(), -1)
            labels.append(torch.multinomial(p, 1, generator=gen)[:, 0])
    y = torch.cat(labels)
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y,
                                      reduction="sum").backward()
    real = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             tok[:, 1:].reshape(-1))
    for h in hooks:
        h.remove()
    return acc, float(real.detach())


def test_block_by_block_fisher_is_the_whole_models(model, calib):
    ours, loss = _ours(model, calib)
    ref, ref_loss = _transformers(model, calib)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert set(ours) == set(ref)
    for key, f in ours.items():
        np.testing.assert_allclose(f.numpy(), ref[key].detach().numpy(), rtol=2e-3,
                                   atol=1e-6 * float(ref[key].max()), err_msg=str(key))
        assert bool((f > 0).all())


def test_prediction_tracks_the_kl_divergence_of_a_small_error(model, calib):
    """A small random error on one layer's weights: the predicted KL per position against the
    measured mean KL(float || perturbed) over the calibration positions."""
    from transformers import AutoModelForCausalLM

    _, cal, _ = calib
    # the Monte-Carlo Fisher of one draw per position is noisy on 120 positions: average 8 draws
    Fs = [_ours(model, calib, seed)[0] for seed in range(8)]
    F = {k: sum(f[k] for f in Fs) / len(Fs) for k in Fs[0]}
    m = AutoModelForCausalLM.from_pretrained(str(model["dir"]), torch_dtype=torch.float32)
    tok = torch.from_numpy(cal.tokens.astype(np.int64))

    def logp():
        with torch.no_grad():
            return torch.log_softmax(m(input_ids=tok).logits.double(), -1)
    p0 = logp()
    gen = torch.Generator().manual_seed(0)
    for i, k in ((0, "v"), (1, "down"), (2, "q"), (2, "up")):
        lin = m.model.layers[i].get_submodule(HF_KEYS[k].rsplit(".", 1)[0])
        w0 = lin.weight.detach().clone()
        e = 0.05 * w0.abs().mean() * torch.randn(w0.shape, generator=gen)
        got = []
        h = lin.register_forward_pre_hook(
            lambda mod, a: got.append(a[0].reshape(-1, a[0].shape[-1]).detach()))
        logp()
        h.remove()
        X = got[0]
        H = 2.0 * X.T @ X / X.shape[0]
        pred = predicted_loss(torch.linalg.vecdot(e @ H, e, dim=-1), F[(i, k)], X.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w0 + e)
        kl = float((p0.exp() * (p0 - logp())).sum(-1).mean())
        with torch.no_grad():
            lin.weight.copy_(w0)
        # diagonal Fisher, independence of g^2 and dy^2 over positions: an estimate, not exact
        assert 0.5 * pred < kl < 2.0 * pred, (i, k, pred, kl)


def test_target_bpw_with_the_fisher_gain_reaches_its_budget(model, calib, tmp_path):
    _, _, f = calib
    logs = []
    res = quantize_model(QuantizeOptions(model_dir=str(model["dir"]), output_dir=str(tmp_path / "o"),
                                         calib_file=str(f), target_bpw=3.0, target_gain="fisher",
                                         seq_len=32, max_samples=8, batch_size=4, progress=False),
                         log=logs.append)
    assert 2.0 < res["summary"]["bpw_linear"] <= 3.0
    assert any("output Fisher on" in ln for ln in logs)
    assert any("predicted loss increase of the plan" in ln for ln in logs)
