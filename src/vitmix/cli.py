"""vitmix: efficient token mixers for vision transformers: train, compare, benchmark, analyze, generate, export.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; that function builds
the sub-parser and sets ``func(args) -> int``. Errors a user can fix (``ValueError``,
``FileNotFoundError``) print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
import threading

from ._util import MissingExtra

# Modules that contribute subcommands, in the order `vitmix --help` lists them.
_SUBCOMMAND_MODULES = (
    "vitmix.train.cli",
    "vitmix.compare.cli",
    "vitmix.bench.cli",
    "vitmix.analysis.cli",
    "vitmix.generate.cli",
    "vitmix.dense.cli",
    "vitmix.robot.cli",
    "vitmix.export",
    "vitmix.listing",
)


class Parser(argparse.ArgumentParser):
    """vitmix's parsers never match a flag by its prefix (``allow_abbrev=False``): with prefixes,
    timm's ``--lr-base 1`` silently became ``--lr-base-batch 1``."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def _check_value(self, action, value):
        """A value outside a flag's choices (or a misspelt command: `vitmix trian`) names the close ones."""
        if action.choices is not None and value not in action.choices:
            from ._util import close_matches

            hint = close_matches(str(value), [str(c) for c in action.choices])
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}.{hint or ''} Choose from "
                                                 f"{', '.join(map(str, action.choices))}")

    def error(self, message: str):
        """One line on stderr, exit status 2 (argparse's usage block would bury it)."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class CommandParser(Parser):
    """The parser of one subcommand (and, through ``add_subparsers``, of its own jobs): a flag it does
    not know is reported as this command's one-line error, with the closest flags it does know,
    rather than by the top-level ``vitmix`` parser."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggest(extras[0])}")
        return namespace, extras

    def _suggest(self, arg: str) -> str:
        from ._util import close_matches

        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            return ""
        known = [o[2:] for o, action in self._option_string_actions.items()
                 if o.startswith("--") and action.help is not argparse.SUPPRESS]
        return close_matches(flag[2:], known).replace(": ", ": --").replace(", ", ", --")


#: How to continue an interrupted job whose own message would name the wrong command.
_CONTINUE = {"compare": "rerun the same command to continue where it stopped",
             "robot": "rerun the same command (train: with --resume) to continue where it stopped"}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="vitmix", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
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
        with _sigterm_as_interrupt():
            return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FloatingPointError, MissingExtra) as err:
        print(f"vitmix {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:   # say how to continue (train names its run directory)
        how = _CONTINUE.get(args.command) or str(err)
        print(f"vitmix {args.command}: interrupted" + (f"; {how}" if how else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:          # `vitmix mixers | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:           # a full disk is the user's to fix: one line (vitmix's names the folder)
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f": {err.filename}" if err.filename else ""
        print(f"vitmix {args.command}: error: {err.strerror}{where}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a scheduler's stop, `kill`) ends a command like Ctrl-C, so it too says how to
    continue instead of exiting silently; the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
