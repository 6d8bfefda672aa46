"""The ``bonsai`` command line: one sub-command per module of ``bonsai_runner.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
``bonsai-convert`` and ``bonsai-quantize`` are aliases of ``bonsai convert`` / ``bonsai quantize``.
Errors of type BonsaiError are printed as one line on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command name -> module under bonsai_runner.commands (imported only when used).
COMMANDS = {
    "demo": "demo",
    "convert": "convert",
    "quantize": "quantize",
    "inspect": "inspect_cmd",
    "plan": "plan",
    "perplexity": "perplexity",
    "compare": "compare",
    "eval-prompts": "eval_prompts",
    "bench": "bench",
    "serve": "serve",
}


def _command_module(name: str):
    return importlib.import_module(f"bonsai_runner.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bonsai",
        description="bonsai-runner: quantize models to ternary PTQ1_0, convert them to one GGUF "
        "file, plan, inspect, evaluate, benchmark and serve them.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _command_module(name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
    return parser


def _version() -> str:
    from . import __version__

    return f"bonsai-runner {__version__}"


def _run(name: str, args: argparse.Namespace) -> int:
    from .errors import BonsaiError

    try:
        return int(_command_module(name).run(args) or 0)
    except BonsaiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    return _run(args.command, args)


def _alias(name: str, argv: list[str] | None) -> int:
    mod = _command_module(name)
    parser = argparse.ArgumentParser(prog=f"bonsai-{name}", description=mod.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(parser)
    return _run(name, parser.parse_args(argv))


def convert_main(argv: list[str] | None = None) -> int:
    return _alias("convert", argv)


def quantize_main(argv: list[str] | None = None) -> int:
    return _alias("quantize", argv)


if __name__ == "__main__":
    sys.exit(main())
