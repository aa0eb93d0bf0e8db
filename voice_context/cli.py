"""``voice-context``: the command line. Each subcommand lives in ``voice_context.commands``.

A module there that defines ``register(subparsers)`` adds its command; the
parser it adds sets ``func`` (taking the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from voice_context import __version__


def build_parser() -> argparse.ArgumentParser:
    import voice_context.commands as commands

    parser = argparse.ArgumentParser(prog="voice-context", description="Long-session memory for voice bots.")
    parser.add_argument("--version", action="version", version=f"voice-context {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
