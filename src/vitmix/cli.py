"""vitmix: efficient token mixers for vision transformers: train, compare, benchmark, analyze, generate, export.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; that function builds
the sub-parser and sets ``func(args) -> int``. Errors a user can fix (``ValueError``,
``FileNotFoundError``) print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# Modules that contribute subcommands, in the order `vitmix --help` lists them.
_SUBCOMMAND_MODULES = (
    "vitmix.train.cli",
    "vitmix.compare.cli",
    "vitmix.bench.cli",
    "vitmix.analysis.cli",
    "vitmix.generate.cli",
    "vitmix.export",
    "vitmix.listing",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitmix", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def _version() -> str:
    from . import __version__

    return f"vitmix {__version__}"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FloatingPointError) as err:
        print(f"vitmix {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitmix {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:          # `vitmix mixers | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
