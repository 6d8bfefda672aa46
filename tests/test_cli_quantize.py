"""`bonsai quantize --outfile m.gguf` without --output-dir (SPEC §5: --outfile may do both at once,
issue #13): the PTQ1_0 directory goes to a temporary directory beside the GGUF and is removed,
the GGUF is complete, and neither an interruption nor an error leaves anything behind."""

from __future__ import annotations

import pytest

from bonsai_runner.errors import BonsaiError
from bonsai_runner.gguf_reader import open_gguf
from bonsai_runner.quantize import QuantizeOptions, quantize_model
from bonsai_runner.quantize.pipeline import BlockLoader
from conftest import run_cli
from model_factory import make_hf_model, write_calibration

SMALL = dict(hidden=128, ffn=256, n_layer=2, n_head=4, n_head_kv=2)
FAST = dict(seq_len=32, max_samples=4, batch_size=4, progress=False)


@pytest.fixture(scope="module")
def ternary(tmp_path_factory):
    """Already-ternary weights: quantized losslessly, no calibration (fast)."""
    return make_hf_model(tmp_path_factory.mktemp("tern") / "m", arch="llama", ternary=True,
                         group=128, **SMALL)


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("float")
    return make_hf_model(d / "m", arch="llama", **SMALL), write_calibration(d / "calib.jsonl", 2)


def test_cli_outfile_alone_writes_the_gguf_and_nothing_else(ternary, tmp_path):
    out = tmp_path / "m.gguf"
    p = run_cli("quantize", "--model-dir", ternary["dir"], "--outfile", out, "--no-progress")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.split() == [str(out)]  # only the file: there is no directory to name
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]
    with open_gguf(out) as g:
        assert any(t.type_name == "PTQ1_0" for t in g.tensors)


def test_cli_outfile_and_output_dir_still_write_both(ternary, tmp_path):
    p = run_cli("quantize", "--model-dir", ternary["dir"], "--output-dir", tmp_path / "d",
                "--outfile", tmp_path / "m.gguf", "--no-progress")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "d" / "quant_config.json").is_file() and (tmp_path / "m.gguf").is_file()


def test_cli_neither_output_is_one_clear_error(ternary, tmp_path):
    p = run_cli("quantize", "--model-dir", ternary["dir"])
    assert p.returncode == 1
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "nothing to write" in err[0] and "--outfile" in err[0], p.stderr


def test_outfile_in_a_missing_directory_is_a_clear_error(ternary, tmp_path):
    with pytest.raises(BonsaiError, match="does not exist; create it first"):
        quantize_model(QuantizeOptions(model_dir=str(ternary["dir"]), output_dir=None,
                                       outfile=str(tmp_path / "no" / "m.gguf"), progress=False),
                       log=lambda s: None)


def test_interrupted_outfile_only_run_leaves_nothing(float_model, tmp_path):
    model, calib = float_model

    class Interrupting(BlockLoader):
        def load_block(self, i):
            if i == 1:
                raise KeyboardInterrupt
            return super().load_block(i)

    with pytest.raises(KeyboardInterrupt):
        quantize_model(QuantizeOptions(model_dir=str(model["dir"]), output_dir=None,
                                       outfile=str(tmp_path / "m.gguf"), calib_file=str(calib), **FAST),
                       log=lambda s: None, loader_cls=Interrupting)
    assert list(tmp_path.iterdir()) == []
