"""``voice-context``: the command line.

Each command is a module that defines ``register(subparsers)``; the parser it adds sets
``func`` (taking the parsed arguments, returning an exit code). A command's module is imported
only when that command runs (or for ``--help``, which lists them all), so ``voice-context serve``
loads none of the tuning tools (:mod:`voice_context.tuning`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

from voice_context import __version__

COMMANDS: Mapping[str, str] = {
    "compact": "voice_context.commands.compact",
    "import": "voice_context.tuning.commands.import_",
    "replay": "voice_context.tuning.commands.replay",
    "score": "voice_context.tuning.commands.score",
    "serve": "voice_context.commands.serve",
}
"""Each command's name and the module that registers it."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with ``command`` registered, or every command when it names none of them."""
    parser = argparse.ArgumentParser(prog="voice-context", description="Long-session memory for voice bots.")
    parser.add_argument("--version", action="version", version=f"voice-context {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = [command] if command is not None and command in COMMANDS else sorted(COMMANDS)
    for name in names:
        importlib.import_module(COMMANDS[name]).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in args_in if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(args_in)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
