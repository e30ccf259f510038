"""How wide a table's columns must be, and how tall its rows, for Streamlit to draw every cell whole.

st.dataframe draws its cells on a canvas (glide-data-grid) and cuts a text longer than its column short; a
cell wraps only in rows taller than 4rem, and then shows as many lines as the row holds; columns wider
together than the page scroll sideways, out of sight. So the Plan page sizes its tables from their text:
`column_px` for a column read on one line, `row_px` for the height a wrapped column needs, and
`fitted_columns` for a whole table inside the main column at a 1,440 px window.

Widths come from `ASCII_PX`, what Chromium's ``measureText`` gives each printable ASCII character in the grid's
font (14 px Source Sans, Streamlit's small size; headers at weight 600, at most 13.2% wider). The grid draws
these texts without kerning that matters (a 51-character layout name: 273.3 px drawn, 274.1 px summed), and
`MARGIN` covers what is left. tests/test_dashboard_browser.py measures the texts the page shows in the page's
own font and holds them to `text_px`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pandas as pd

ASCII_PX = dict(zip(map(chr, range(32, 127)), (
    2.8, 4.05, 5.96, 6.96, 6.96, 11.54, 8.53, 3.49, 4.24, 4.24, 5.85, 6.96, 3.49, 4.35, 3.49, 4.9,
    6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 3.49, 3.49, 6.96, 6.96, 6.96, 5.95,
    11.86, 7.6, 8.23, 7.99, 8.61, 7.38, 6.92, 8.64, 9.13, 3.68, 6.71, 8.11, 6.8, 10.18, 9.06, 9.3,
    7.92, 9.3, 7.97, 7.48, 7.5, 9.03, 7.21, 11, 7.18, 6.66, 7.55, 4.24, 4.9, 4.24, 6.96, 7,
    7.59, 7.06, 7.74, 6.38, 7.77, 6.94, 4.09, 7.06, 7.62, 3.44, 3.46, 6.93, 3.57, 11.61, 7.66, 7.59,
    7.77, 7.77, 4.86, 5.87, 4.73, 7.62, 6.54, 10.07, 6.24, 6.54, 5.95, 4.24, 3.37, 4.24, 6.96,
), strict=True))
"""Pixels each printable ASCII character takes at 14 px Source Sans (Chromium 156, Streamlit 1.67's font)."""
OTHER_PX = 14.0
"""A character beyond ASCII: taken as wide as the font is tall."""
MARGIN = 1.04
"""On top of the summed widths: rounding, and a font renderer that differs a little from Chromium's."""
BOLD = 1.14
"""A header's weight 600 against the cells' 400: at most 13.2% wider, a character at a time."""
CELL_PADDING_PX = 8
"""glide-data-grid's padding each side of a cell's text (Streamlit's theme: spacing.sm, 0.5rem)."""
FONT_PX = 14
LINE_HEIGHT = 1.4
"""glide-data-grid's distance between wrapped lines, a multiple of the font size."""
WRAPS_ABOVE_PX = 64
"""Streamlit wraps a text cell only in rows taller than 4rem."""


def text_px(text: str) -> float:
    """The width ``text`` takes on one line in Streamlit's grid font, a little over (`MARGIN`)."""
    return MARGIN * sum(ASCII_PX.get(c, OTHER_PX) for c in text)


def column_px(texts: Iterable[object], header: str = "") -> int:
    """The width (pixels) a column needs to show each of ``texts`` and its bold header on one line."""
    widest = max((text_px(t) for t in set(map(str, texts))), default=0.0)  # a search repeats its labels
    return math.ceil(max(widest, BOLD * text_px(header)) + 2 * CELL_PADDING_PX)


def wrapped_lines(text: str, column: int) -> int:
    """How many lines ``text`` wraps to in a column ``column`` pixels wide: greedily by words, as the grid
    wraps; a word longer than a line takes lines of its own."""
    room = column - 2 * CELL_PADDING_PX
    space = text_px(" ")
    lines, line = 0, None  # the width used on the current line; None before the first word
    for word in text.split():
        width = text_px(word)
        if line is not None and line + space + width <= room:
            line += space + width
        elif width <= room:
            lines, line = lines + 1, width
        else:
            taken = math.ceil(width / room)
            lines, line = lines + taken, width - (taken - 1) * room
    return max(lines, 1)


def row_px(texts: Iterable[object], column: int) -> int | None:
    """The row height (pixels) that shows each of ``texts`` whole in a column ``column`` pixels wide: None when
    every text fits on one line (Streamlit's default rows), else over 4rem (so cells wrap) and tall enough for
    the most lines any text takes."""
    lines = max((wrapped_lines(t, column) for t in set(map(str, texts))), default=1)
    if lines <= 1:
        return None
    needed = FONT_PX + FONT_PX * LINE_HEIGHT * (lines - 1) + 2 * CELL_PADDING_PX
    return max(WRAPS_ABOVE_PX + 1, math.ceil(needed))


MAIN_PX = 950
"""What a table may take without scrolling sideways: the main column is 970 px wide at a 1,440 px window with
the sidebar open (Streamlit's wide layout), less the grid's border and a vertical scroll bar."""
WRAPPED_MIN_PX = 180
"""The narrowest a wrapped column gets, however much its neighbours take: a search's rejected candidates hold
a label and a layout of up to 60 characters whole beside two numbers ("tp 1, pp 2 (interleaved x2), cp 1, dp 4,
zero 3, no reshard"), which leave it about 200 px of the 950."""


def number_text(value: object, fmt: str | None) -> str:
    """A number as a NumberColumn with sprintf format ``fmt`` shows it ("%,.1f": "1,234.5"; "%,d": "1,234"),
    "-" when missing; another format (a named one, none) as thousands and one decimal."""
    if pd.isna(value):
        return "-"
    if fmt and fmt.startswith("%") and fmt[-1] in "dfg":
        number = int(value) if fmt[-1] == "d" else float(value)
        return ("{:" + fmt[1:] + "}").format(number)
    return f"{float(value):,.1f}"


def extremes(numbers: pd.Series) -> list[object]:
    """The numbers of ``numbers`` whose text is the longest: the largest and smallest (most digits before the
    point, a sign) and the smallest apart from zero ("%,.4g" writes 0.0001234 longer than 123.4); a missing one
    ("-") when any is missing. No digit or sign is wider than a zero, so the longest text is the widest."""
    values = pd.to_numeric(numbers, errors="coerce")
    present = values.dropna()
    found: list[object] = [pd.NA] if len(present) < len(values) else []
    if len(present):
        nonzero = present[present != 0].abs()
        found += [present.max(), present.min(), *([nonzero.min()] if len(nonzero) else [])]
    return found


def fitted_columns(config: dict[str, dict], frame: pd.DataFrame, shown: Sequence[str], whole: tuple[str, ...] = (),
                   wrapped: str | None = None) -> tuple[dict[str, dict], int | None]:
    """``config`` (a ``column_config``) with widths that show ``frame``'s ``shown`` columns whole, and the row
    height (None: Streamlit's one-line rows).

    Each column of ``whole`` is as wide as its longest text (`column_px`), every other one but ``wrapped`` as
    wide as its numbers and header; ``wrapped`` (a column of sentences) takes what is left of `MAIN_PX`, at
    least `WRAPPED_MIN_PX`, and the rows are as tall as its longest text wrapped there (`row_px`).
    """
    fitted = dict(config)
    for name in shown:
        if name in whole:
            texts = frame[name]
        elif name != wrapped:
            fmt = config[name].get("type_config", {}).get("format")
            texts = ["0" * max((len(number_text(v, fmt)) for v in extremes(frame[name])), default=0)]
        else:
            continue
        fitted[name] = {**config[name], "width": column_px(texts, config[name]["label"])}
    if wrapped is None:
        return fitted, None
    width = max(WRAPPED_MIN_PX, MAIN_PX - sum(fitted[name]["width"] for name in shown if name != wrapped))
    fitted[wrapped] = {**config[wrapped], "width": width}
    return fitted, row_px(frame[wrapped], width)
