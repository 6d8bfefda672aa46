#!/usr/bin/env python3
"""A second evaluation text, of another domain than the built-in one: Python source code.

The built-in evaluation text (python/bonsai_runner/data/eval.txt) is mostly English prose; issue
#17 asks for the quality table on a second text of another domain, so that nothing is tuned to
one text. This one is the source of standard-library modules that the built-in calibration set
does NOT draw from (quantize/calibration.py's STDLIB_MODULES), read from the running Python, so
the text is not in this repository and does not overlap the calibration text:

    python benchmarks/eval_texts.py code.txt          # writes it (about 24,000 characters)

The module list is fixed and each module is taken whole, in order, until CHARS characters; the
result depends on the Python version (the table that uses it prints that version).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

MODULES = ("sched", "graphlib", "colorsys", "netrc", "quopri", "smtplib", "ftplib", "poplib",
           "imaplib", "plistlib", "mailbox")
CHARS = 24_000


def code_text(chars: int = CHARS) -> str:
    """The text: whole modules of MODULES, in order, cut at the first line end after `chars`."""
    from bonsai_runner.quantize.calibration import STDLIB_MODULES

    clash = set(MODULES) & set(STDLIB_MODULES)
    if clash:
        raise SystemExit(f"eval_texts: {sorted(clash)} are calibration modules; pick others")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, n = [], 0
    for m in MODULES:
        f = stdlib / f"{m}.py"
        if not f.is_file():
            continue
        t = f.read_text(encoding="utf-8", errors="replace")
        parts.append(t)
        n += len(t)
        if n >= chars:
            break
    text = "\n".join(parts)
    if len(text) < chars // 2:
        raise SystemExit(f"eval_texts: this Python's standard library at {stdlib} has too little "
                         "of the listed source (some distributions ship only .pyc files)")
    cut = text.find("\n", chars)
    return text if cut < 0 else text[:cut + 1]


def write_code_text(path: Path) -> Path:
    path.write_text(code_text(), encoding="utf-8")
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    p = write_code_text(Path(sys.argv[1]))
    print(f"{p}: {p.stat().st_size} bytes of Python {sys.version.split()[0]} standard-library "
          "source")
