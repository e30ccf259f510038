"""Table widths from their text (headroom.dashboard.widths), against what Chromium draws."""

from __future__ import annotations

import math

import pandas as pd
import pytest

pytest.importorskip("streamlit")
import streamlit as st

from headroom.dashboard import widths

DRAWN_PX = {
    "tp 2 +sp, pp 2 (interleaved x2), cp 2, dp 2, zero 1": 273.29,
    "micro 4 x accum 1, op-selective": 181.0,
    "micro 16 x accum 1, none": 147.0,
    "recommended": 86.0,
}
"""Widths Chromium 156's ``measureText`` gave these texts in the dashboard grid's font (14 px Source Sans), on the
Plan page of the H200 reference bundle; tests/test_dashboard_browser.py measures every shown text again."""


@pytest.mark.parametrize("text", DRAWN_PX)
def test_a_text_is_given_what_it_draws_in_and_little_more(text):
    assert DRAWN_PX[text] <= widths.text_px(text) <= 1.06 * DRAWN_PX[text]


def test_a_column_holds_its_longest_text_and_its_header():
    texts = ["tp 1, pp 1, cp 1, dp 1, zero 0", "tp 2 +sp, pp 2 (interleaved x2), cp 2, dp 2, zero 1"]
    assert widths.column_px(texts, "layout") == math.ceil(widths.text_px(texts[1]) + 16)
    assert widths.column_px(["1"], "what breaks the budget") == math.ceil(
        widths.BOLD * widths.text_px("what breaks the budget") + 16)
    assert widths.column_px([], "") == 16
    assert widths.text_px("é") == widths.MARGIN * widths.OTHER_PX


def test_lines_wrap_by_words_and_rows_hold_them():
    word = widths.text_px("budget")
    room = math.ceil(2 * word + widths.text_px(" ")) + 1  # two words a line
    column = room + 2 * widths.CELL_PADDING_PX
    assert widths.wrapped_lines("budget", column) == 1
    assert widths.wrapped_lines("budget budget", column) == 1
    assert widths.wrapped_lines("budget budget budget", column) == 2
    assert widths.wrapped_lines("budget " * 5, column) == 3
    assert widths.wrapped_lines("x" * 100, 100) == math.ceil(widths.text_px("x" * 100) / 84)  # one long word
    assert widths.row_px(["budget"], column) is None  # one line: Streamlit's own rows
    assert widths.row_px(["budget budget budget"], column) == 65  # two lines: over 4rem, or Streamlit cuts
    assert widths.row_px(["budget " * 5], column) == 70  # 14 px + 2 x 19.6 px between lines + 2 x 8 px padding


def test_number_columns_are_as_wide_as_their_format_shows_them():
    assert widths.number_text(206_624.2, "%,.0f") == "206,624"
    assert widths.number_text(1761, "%,d") == "1,761"
    assert widths.number_text(0.634349, "%,.4g") == "0.6343"
    assert widths.number_text(53.54, "%,.1f") == "53.5"
    assert widths.number_text(0.1234, "percent") == "0.1"
    assert widths.number_text(None, "%,d") == widths.number_text(pd.NA, "%,d") == widths.number_text(
        float("nan"), "%,.1f") == "-"


def test_the_widest_number_is_among_the_extremes():
    numbers = pd.Series([0.5, 0.0, 123.4, -2.0, 0.0001234, None])
    assert [widths.number_text(v, "%,.4g") for v in widths.extremes(numbers)] == ["-", "123.4", "-2", "0.0001234"]
    every = max(len(widths.number_text(v, "%,.4g")) for v in numbers)
    assert max(len(widths.number_text(v, "%,.4g")) for v in widths.extremes(numbers)) == every
    assert widths.extremes(pd.Series([], dtype=float)) == []
    assert max(widths.ASCII_PX[c] for c in "0123456789,.-+e") == widths.ASCII_PX["0"]  # so zeros bound a number


def test_a_table_fits_the_page_and_its_sentences_wrap_in_what_is_left():
    config = {"candidate": st.column_config.TextColumn("candidate"),
              "needs": st.column_config.NumberColumn("needs (GB)", format="%,.1f"),
              "why": st.column_config.TextColumn("what breaks the budget", width=280)}
    frame = pd.DataFrame({"candidate": ["micro 4 x accum 1, op-selective", "micro 1 x accum 64, full"],
                          "needs": [80.7, 135.2],
                          "why": ["activations (29.0 GB) break it on top of 32.0 GB static",
                                  "static state alone (107.8 GB of parameters, gradients and optimizer state) breaks "
                                  "it " * 4]})
    fitted, rows = widths.fitted_columns(config, frame, ["candidate", "needs", "why"], whole=("candidate",),
                                         wrapped="why")
    assert fitted["candidate"]["width"] == widths.column_px(frame["candidate"], "candidate")
    assert fitted["needs"]["width"] == widths.column_px(["135.2"], "needs (GB)")
    assert sum(fitted[name]["width"] for name in ("candidate", "needs", "why")) == widths.MAIN_PX
    assert rows == widths.row_px(frame["why"], fitted["why"]["width"]) and rows > widths.WRAPS_ABOVE_PX
    assert config["why"]["width"] == 280 and fitted["why"]["label"] == "what breaks the budget"  # a copy
    one_line, none = widths.fitted_columns(config, frame.head(1), ["candidate", "needs"], whole=("candidate",))
    assert none is None and "width" in one_line["needs"] and one_line["why"] == config["why"]
    crowded = {**config, "candidate": st.column_config.TextColumn("x" * 200)}
    squeezed, _ = widths.fitted_columns(crowded, frame, ["candidate", "why"], whole=("candidate",), wrapped="why")
    assert squeezed["why"]["width"] == widths.WRAPPED_MIN_PX  # never narrower, however wide its neighbours
