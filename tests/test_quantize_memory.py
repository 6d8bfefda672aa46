"""Peak memory of the quantizer is bounded by one block, not by the model (issue #4, Done-when).

Two synthetic llama models that differ only in depth (8 and 32 blocks of hidden 384 / ffn 1024:
~7 MB of float32 weights per block, so the 32-block model holds ~170 MB more than the 8-block one,
well above the interpreter's own baseline) are quantized to GGUF by `bonsai quantize` in child
processes; the peak resident set of each child (ru_maxrss from wait4) must agree within 15%.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from model_factory import make_hf_model, write_calibration

SHAPE = dict(hidden=384, ffn=1024, n_head=6, n_head_kv=6, tokenizer="bpe", arch="llama", seed=2)


# ru_maxrss survives exec and, after fork/vfork, starts from the parent's high-water mark, so a
# child of the (large) pytest process would report pytest's size. A small launcher process starts
# the quantizer instead and reports that grandchild's own peak (wait4).
LAUNCHER = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:]); "
            "_, st, ru = os.wait4(p.pid, 0); print('PEAK_RSS_KB', ru.ru_maxrss); "
            "sys.exit(os.waitstatus_to_exitcode(st))")


def _peak_rss_mib(args: list[str]) -> float:
    p = subprocess.run([sys.executable, "-c", LAUNCHER, sys.executable, "-m", "bonsai_runner",
                        *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    kb = [ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("PEAK_RSS_KB")]
    return int(kb[-1]) / 1024.0


@pytest.mark.slow
def test_peak_rss_does_not_grow_with_depth(tmp_path):
    calib = write_calibration(tmp_path / "calib.jsonl", repeats=8)
    peaks = {}
    for depth in (8, 32):
        m = make_hf_model(tmp_path / f"m{depth}", n_layer=depth, **SHAPE)
        peaks[depth] = _peak_rss_mib([
            "quantize", "--model-dir", str(m["dir"]), "--calib-file", str(calib),
            "--output-dir", str(tmp_path / f"o{depth}"), "--outfile",
            str(tmp_path / f"q{depth}.gguf"), "--max-samples", "4", "--seq-len", "64",
            "--no-progress"])
        weights_mib = sum(a.nbytes for a in m["tensors"].values()) / 2**20
        del m
        assert (tmp_path / f"q{depth}.gguf").stat().st_size > 0
    grown = peaks[32] / peaks[8] - 1.0
    assert grown < 0.15, (peaks, f"{grown:.1%}", f"32-block weights {weights_mib:.0f} MiB")
