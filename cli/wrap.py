"""The CLI's human-readable text, wrapped to the terminal: one place for every command that prints prose.

Width (`columns`, read with ``shutil.get_terminal_size``):

- ``$COLUMNS`` where it is set (a positive integer): the user's own request, taken as given, so
  ``COLUMNS=1000 headroom plan ... | grep`` keeps one entry a line;
- else the terminal's width, at most ``MAX_COLUMNS`` (100): a wide terminal still gets lines an eye can
  follow back to their start (about a code review's width);
- else, stdout not a terminal (a pipe, a file, a log, a test), ``PIPE_COLUMNS`` (100): a log reads the same
  on every machine, as it would on a wide terminal;
- never under ``MIN_COLUMNS`` (60): narrower, a continued line holds a handful of words.

What wraps (`wrap`), line by line; a line that fits is left exactly as it is:

- prose: at spaces, continued under the line's own indent plus ``HANG`` (4), or under the text after its
  bullet (``- ``, ``* ``, ``1. ``) where it has one;
- a term and its text, split by one run of two or more spaces (``tp 1, pp 1 ...      as fast within 1%``):
  the term stays whole on the first line and its text continues under itself where at least
  ``MIN_MEASURE`` (30) columns are left beside the term, else the text starts on the next line, under
  the line's indent plus ``HANG``.

What never wraps, even past the width:

- a table row or aligned columns: two or more runs of two or more spaces inside the line;
- a command line (``headroom ...``, ``$ ...``, ``python ...``) and JSON (a line opening with ``{`` or ``[``);
- inside prose, a word longer than the line (a path, a URL), a span in backquotes, a ``--flag value`` pair,
  an inline ``headroom <command> [--flag value ...]``, and a figure with its word and unit (``needs 285.8
  GB`` is not split): each is moved whole to the next line instead of cut.

``--json``, ``--export``, `headroom models`/`hardware` tables and the shell completion scripts never pass
through here, nor do errors on stderr (`headroom.cli.main` bounds those to one line).
"""

from __future__ import annotations

import os
import re
import shutil

MIN_COLUMNS = 60
"""The narrowest wrap: below it a continued line holds a handful of words."""
MAX_COLUMNS = 100
"""The widest wrap, however wide the terminal: longer lines are hard to follow back to their start."""
PIPE_COLUMNS = 100
"""The width when stdout is not a terminal and ``$COLUMNS`` is not set."""
HANG = 4
"""Columns a continued prose line is indented beyond its first line's indent."""
MIN_MEASURE = 30
"""The fewest columns beside a term its text is wrapped in; with fewer the text starts under the term."""

_GAP = re.compile(r" {2,}")
_BULLET = re.compile(r"(?:[-*\u2022]|\d+[.)]) ")
_VERBATIM = re.compile(r"(?:\$ |headroom |python3? |torchrun |[{\[])")
_FLAG = re.compile(r"--[A-Za-z][\w-]*")
_WORD = re.compile(r"[a-z][a-z-]*")
_NUMBER = re.compile(r"\(?\d[\d.,]*[%x]?[,;:)]*")
_ENDS = (",", ";", ":", ")")
UNITS = frozenset({"B", "kB", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "s", "ms", "us", "GB/s", "TB/s",
                   "TFLOP/s", "TFLOP", "tokens/s"})
"""Units a figure keeps on its line (``285.8 GB``, ``59.601 s``)."""


def columns() -> int:
    """The width text is wrapped to: ``$COLUMNS`` where set, else the terminal's at most ``MAX_COLUMNS``, else
    (not a terminal) ``PIPE_COLUMNS``; never under ``MIN_COLUMNS``."""
    size = shutil.get_terminal_size((PIPE_COLUMNS, 24)).columns  # $COLUMNS first, as shutil reads it
    return max(MIN_COLUMNS, size if _explicit_columns() else min(MAX_COLUMNS, size))


def _explicit_columns() -> bool:
    """Whether ``$COLUMNS`` is what shutil.get_terminal_size returns: a positive integer (0 or text is ignored)."""
    try:
        return int(os.environ.get("COLUMNS", "")) > 0
    except ValueError:
        return False


def wrap(text: str, width: int | None = None) -> str:
    """``text`` with each line that runs past ``width`` (default `columns()`) wrapped as the module says."""
    width = columns() if width is None else width
    return "\n".join(wrap_line(line, width) for line in text.split("\n"))


def wrap_line(line: str, width: int) -> str:
    """One line, wrapped to ``width`` unless it fits or is one that never wraps (table row, command, JSON)."""
    if len(line) <= width:
        return line
    line = line.rstrip()
    body = line.lstrip(" ")
    indent = len(line) - len(body)
    if len(line) <= width or _VERBATIM.match(body):
        return line
    gaps = list(_GAP.finditer(body))
    if len(gaps) >= 2:  # a table row: its columns stay in line with the rows above and below
        return line
    if gaps:  # a term and its text
        column = indent + gaps[0].end()
        if width - column < MIN_MEASURE:  # too little room beside the term: the text starts under it
            hang = " " * (indent + HANG)
            return line[:column].rstrip() + "\n" + _fill(hang, _units(line[column:]), width, hang)
        hang = column
    elif bullet := _BULLET.match(body):
        column = hang = indent + bullet.end()
    else:
        column, hang = indent, indent + HANG
    return _fill(line[:column], _units(line[column:]), width, " " * hang)


def _fill(first: str, units: list[str], width: int, hang: str) -> str:
    """Greedy fill: as many units a line as fit in ``width`` (at least one), the first line led by ``first``."""
    lines, current, bare = [], first, True
    for unit in units:
        if not bare and len(current) + 1 + len(unit) > width:
            lines.append(current)
            current, bare = hang + unit, False
        else:
            current, bare = current + ("" if bare else " ") + unit, False
    return "\n".join([*lines, current])


def _units(text: str) -> list[str]:
    """The words of ``text``, with what must stay on one line joined into one unit: a span in backquotes, a
    ``--flag value`` pair, an inline ``headroom <command> ...``, and a figure with the word before it and
    its unit after it (``needs 285.8 GB``, ``pp 1``), unless a comma or the like ends the word before."""
    words, units = text.split(), []
    i = 0
    while i < len(words):
        j = i + 1
        if words[i].count("`") % 2:  # opens a span in backquotes: up to the word that closes it
            while j < len(words) and words[j].count("`") % 2 == 0:
                j += 1
            j = min(j + 1, len(words))
        elif words[i] == "headroom" and j < len(words) and _WORD.fullmatch(words[j]):
            j += 1  # the command, one more bare word (a subcommand's action), then its flags and their values
            if j < len(words) and _WORD.fullmatch(words[j]):
                j += 1
            j = _flags(words, j)
        elif _FLAG.fullmatch(words[i]):
            j = _flags(words, i, run=False)
        unit = " ".join(words[i:j])
        if j == i + 1 and units and _joins(units[-1].rsplit(" ", 1)[-1], unit):
            units[-1] += " " + unit
        else:
            units.append(unit)
        i = j
    return units


def _joins(last: str, word: str) -> bool:
    """Whether ``word`` stays on the line of the word before it, ``last``: a figure with its word (``pp 1``,
    ``of 80.0``) and a unit with its figure (``80.0 GB``), unless ``last`` ends a clause (, ; : or ))."""
    if last.endswith(_ENDS):
        return False
    figure = _NUMBER.fullmatch(word) is not None and not word.startswith("(")
    return figure or (word.rstrip(",;:)") in UNITS and _NUMBER.fullmatch(last) is not None)


def _flags(words: list[str], i: int, run: bool = True) -> int:
    """The index past the ``--flag [value]`` words from ``i``: a run of them (a command's), or with ``run``
    false one pair; a word ending in , ; : or ) ends either."""
    while i < len(words) and _FLAG.match(words[i]):
        ends = words[i][-1] in ",;:)"
        i += 1
        if not ends and i < len(words) and not words[i].startswith("-"):
            ends = words[i][-1] in ",;:)"
            i += 1
        if ends or not run:
            break
    return i
