"""Sub-commands of the ``bonsai`` CLI (see bonsai_runner.cli)."""
