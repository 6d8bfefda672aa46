"""The error type every user-facing entry point raises for bad input.

The native engine raises ``bonsai_runner._core.BonsaiError``; it is the same class, so callers
catch one type whether the problem was found in Python or in C++.
"""

try:
    from ._core import BonsaiError  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - only when the package is used without its native module

    class BonsaiError(ValueError):
        """Bad input: the message names the problem and, where there is one, the fix."""


__all__ = ["BonsaiError"]
