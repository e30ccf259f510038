"""``headroom``: one command, one subcommand per job.

Each subcommand module defines ``add_parser(subparsers)`` and a ``run(args)``
handler; handlers import heavy subsystems lazily so ``headroom estimate`` never
loads torch or a database driver.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import NoReturn

from headroom.cli import agent, catalog, completion, dashboard, db, estimate, plan
from headroom.core.errors import ConfigError
from headroom.core.safe_text import printable

COMMANDS = (estimate, plan, agent, catalog, db, dashboard, completion)


class Formatter(argparse.HelpFormatter):
    """argparse's, but a description or epilog keeps its line breaks: each line is wrapped to the terminal on
    its own, an indented one under its own indent (a list of definitions)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            own = line[:len(line) - len(line.lstrip())]
            lead, hang = indent + own, indent + own + ("  " if own else "")  # a definition hangs under its term
            lines.append(textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=hang)
                         if line.strip() else "")
        return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), as every other input error is, and help keeps
    the line breaks of its descriptions (`Formatter`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_bounded(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="headroom",
        description="Plan GPU training runs from real measurements.",
    )
    parser.add_argument("--version", action="version", version=f"headroom {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def version() -> str:
    """The installed package's version (``pyproject.toml``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("headroom")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


DEBUG_ENV = "HEADROOM_DEBUG"
"""Set to 1 to let an unexpected error's traceback through."""


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 2 the input is wrong (one line says which value and what would do), 3 a plan
    found nothing that fits, 1 the machine failed the command (I/O, memory, a defect), also one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except ConfigError as err:
        print(f"headroom: error: {_one_line(err, kind=False)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `headroom ... | head`
        return 0
    except KeyboardInterrupt:
        print("headroom: interrupted", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as err:
        print(f"headroom: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except Exception as err:  # a defect: one line for the user, the traceback on request
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        print(f"headroom: internal error: {_one_line(err)}; please report it "
              f"(rerun with {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 1


ERROR_LIMIT = 2_000
"""Characters of an error's line: one that quotes a value of a million characters shows its start."""


def _one_line(err: BaseException, kind: bool = True) -> str:
    """The error as one line a terminal shows as written, whatever a value quoted in it holds (a path or a
    stored name may hold a line break, ESC or U+202E: headroom.core.safe_text); ``kind``: led by the exception's type."""
    text = _bounded(str(err)) or "no message"
    return f"{type(err).__name__}: {text}" if kind else text


def _bounded(message: str) -> str:
    """``message`` escaped for a terminal (headroom.core.safe_text) and cut to ``ERROR_LIMIT`` characters."""
    text = printable(message)
    return f"{text[:ERROR_LIMIT]}... ({len(text):,} characters)" if len(text) > ERROR_LIMIT else text


if __name__ == "__main__":
    sys.exit(main())
