"""Text from outside (a store, a bundle, a label, a config) that must neither break a store nor spoof a screen.

What may be stored (`text_problem`): a name (a device, a host, a software version, a label) is one line of at
most ``NAME_LIMIT`` characters without control or bidirectional formatting characters; a message (why a
result is not ok) may span lines up to ``MESSAGE_LIMIT`` characters. Neither holds a NUL or a lone surrogate,
which neither SQLite nor PostgreSQL round-trips. The limits are the same on both back ends: PostgreSQL refuses
an index row over 2,704 bytes, and a name of ``NAME_LIMIT`` characters is at most 1,024 bytes of UTF-8.

What may be shown (`printable`): text already stored, or quoted in an error, goes to a terminal with every
control character (a newline that would start a fake row, ESC that recolours it, BEL) and every bidirectional
formatting character (U+202E, which reverses what follows) written as an escape, so the screen shows the
characters the text holds; so is a lone surrogate, which no terminal's encoding can write. A value quoted
with ``repr`` (``{value!r}``, as errors quote them) is escaped already.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NAME_LIMIT = 256
"""Characters a stored name may hold: more than any device, host, version or label needs."""
MESSAGE_LIMIT = 4_096
"""Characters a stored message may hold."""
MAX_LABELS = 64
"""Labels a run may carry, each key and value a name."""

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Arabic letter mark, left-to-right and right-to-left marks, embeddings, overrides and isolates."""
_UNSHOWABLE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")
"""What `printable` escapes: controls, bidirectional formatting, and lone surrogates (no terminal encodes them)."""
_UNSTORABLE_IN_MESSAGE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
"""A message may hold line breaks and tabs, nothing else that moves or recolours the screen."""
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def text_problem(value: str, *, message: bool = False) -> str | None:
    """Why ``value`` may not be stored as a name (or, ``message``, as a message); None when it may."""
    limit = MESSAGE_LIMIT if message else NAME_LIMIT
    if len(value) > limit:
        return f"must be at most {limit:,} characters (it has {len(value):,})"
    if problem := unstorable(value):
        return problem
    if (_UNSTORABLE_IN_MESSAGE if message else _UNSHOWABLE).search(value):
        what = "a control" if message else "a line break, a control"
        return f"must not contain {what} or a bidirectional formatting character"
    return None


def unstorable(value: str) -> str | None:
    """What no stored text may hold, in a field or inside a JSON document: what neither SQLite nor PostgreSQL
    round-trips (a NUL, a lone surrogate); None when it holds neither."""
    if "\x00" in value:
        return "must not contain a NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must not contain a lone surrogate (it is not text)"
    return None


def printable(text: object) -> str:
    """``text`` as a terminal should show it: control and bidirectional formatting characters escaped."""
    return _UNSHOWABLE.sub(_escape, str(text))


def printable_lines(lines: Iterable[str]) -> str:
    """Lines joined by line breaks, each `printable`: a line break inside one (a stored name's) is escaped."""
    return "\n".join(map(printable, lines))


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    return _ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
