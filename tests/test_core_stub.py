"""The type stub shipped beside the native module names every public class and function of it."""

from __future__ import annotations

import ast
from pathlib import Path

from bonsai_runner import _core

STUB = Path(__file__).resolve().parents[1] / "python" / "bonsai_runner" / "_core.pyi"


def _stub_names() -> set[str]:
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_stub_covers_the_module():
    public = {n for n in dir(_core) if not n.startswith("_")}
    # the cuda_* functions other than cuda_device_count exist in CUDA builds only; the stub is made
    # from a CPU build
    public -= {n for n in public if n.startswith("cuda_") and n != "cuda_device_count"}
    missing = public - _stub_names()
    assert not missing, f"_core.pyi lacks {sorted(missing)}: run scripts/gen_core_stub.sh"
