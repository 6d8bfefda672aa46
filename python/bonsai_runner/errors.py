"""The error type every user-facing entry point raises for bad input.

The native engine raises ``bonsai_runner._core.BonsaiError``; it is the same class, so callers
catch one type whether the problem was found in Python or in C++.
"""

try:
    from ._core import BonsaiError  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - only when the package is used without its native module

    class BonsaiError(ValueError):
        """Bad input: the message names the problem and, where there is one, the fix."""


__all__ = ["BonsaiError", "check_model_file"]


def check_model_file(path: str) -> str:
    """`path` if it is a readable regular file; otherwise one BonsaiError that says what it is instead
    (missing, a directory, unreadable) and what to give. Used by every front end that opens a GGUF."""
    import os

    if os.path.isdir(path):
        raise BonsaiError(f"{path} is a directory, not a model file: give the path of the .gguf file "
                          "(to convert a Hugging Face directory first: bonsai convert DIR --outfile model.gguf)")
    if not os.path.exists(path):
        raise BonsaiError(f"model file not found: {path}")
    if not os.path.isfile(path):
        raise BonsaiError(f"{path} is not a regular file: give the path of a .gguf model file")
    if not os.access(path, os.R_OK):
        raise BonsaiError(f"model file {path} is not readable (permission denied)")
    return path
