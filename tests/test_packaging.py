"""The package declares what it imports: every third-party module that bonsai_runner imports (at
module level or inside a function, i.e. at run time of some command) is provided by a distribution
in pyproject's [project] dependencies, not only by the test extra. `pip install .` alone must be
enough for the README's first command (`bonsai demo` quantizes a byte-level BPE model, whose
calibration text goes through `tokenizers`)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "bonsai_runner"

# Import name -> the distribution that provides it (when the two differ or it comes with another).
PROVIDED_BY = {"starlette": "fastapi", "jinja2": "jinja2", "yaml": "pyyaml"}


def _dependencies(section: str) -> set[str]:
    """Distribution names of pyproject's `dependencies = [...]` list (section 'project') or of one
    optional-dependencies extra."""
    text = (ROOT / "pyproject.toml").read_text()
    if section == "project":
        m = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    else:
        m = re.search(rf"^{section} = \[(.*?)\]", text, re.S | re.M)
    assert m, f"no {section} dependency list in pyproject.toml"
    names = re.findall(r'"([A-Za-z0-9_.\-]+)', m.group(1))
    return {n.lower().replace("_", "-") for n in names}


def _third_party_imports() -> dict[str, str]:
    """Top-level module name -> one file that imports it, over the whole package."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("bonsai_runner", "__future__"):
                    continue
                found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_runtime_import_is_a_declared_dependency():
    deps = _dependencies("project")
    missing = {}
    for module, where in _third_party_imports().items():
        dist = PROVIDED_BY.get(module, module).lower().replace("_", "-")
        if dist not in deps:
            missing[module] = where
    assert not missing, (f"imported by the package but not in pyproject's [project] dependencies "
                         f"(`pip install .` would not install them): {missing}")


def test_the_scan_sees_the_imports_it_must():
    # A scan that found nothing would pass vacuously.
    found = _third_party_imports()
    for module in ("numpy", "gguf", "sentencepiece", "tokenizers", "fastapi"):
        assert module in found, module
