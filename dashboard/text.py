r"""Stored and user-given text shown inside Markdown: as the characters it holds, never as markup.

Streamlit renders captions, alerts and st.markdown as Markdown (raw HTML is already escaped). A device
name from a bundle such as ``[click here](https://...) ![x](https://.../p.png)`` would otherwise become a
live link and a remote image. ``plain`` backslash-escapes what makes markup in the middle of a line
(links and images, emphasis, code, HTML, entities, tables, headings), ``:`` (Streamlit's shortcodes and
colour directives), ``$`` (its LaTeX) and a list marker at the start, turns line breaks into spaces and
writes other control and bidirectional formatting characters as escapes (headroom.core.safe_text: U+202E would
reverse the rest of the line).
Escapes do not stop Streamlit from making links of bare URLs in the text it renders (seen in Chromium:
``https\://x`` still became a link), so an invisible word joiner (U+2060) goes inside every ``://``,
``www.`` and ``@``. Names keep their hyphens, dots and parentheses, so "llama3.2-1b (datasheet)" reads the
same in the Markdown source as on the page.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from headroom.core.measured.calibration import Calibration, Fit
from headroom.core.safe_text import printable

if TYPE_CHECKING:
    from headroom.core.planning.planner import Plan

_MARKUP = re.compile(r"([\\`*_\[\]<>~$&:|#!])")
_LINKABLE = re.compile(r"(?i)(://|www\.|@)")
_LIST_MARKER = re.compile(r"^(\d+)([.)])|^([-+])")
WORD_JOINER = "\u2060"


def plain(text: object) -> str:
    """``text`` escaped so that Markdown shows it literally, on one line, and no part of it becomes a link."""
    text = _LINKABLE.sub(lambda m: m[1][:-1] + WORD_JOINER + m[1][-1], printable(" ".join(str(text).split())))
    escaped = _MARKUP.sub(r"\\\1", text)
    return _LIST_MARKER.sub(lambda m: f"{m[1]}\\{m[2]}" if m[1] else f"\\{m[3]}", escaped)


def shown_calibration(calibration: Calibration) -> Calibration:
    """``calibration`` with the stored text its confidence quotes (the device's name, steps' labels, the measured
    models and policies) made plain."""
    def fit(one: Fit) -> Fit:
        return replace(one, outliers=tuple(plain(label) for label in one.outliers))

    measured_on = calibration.measured_on
    return replace(calibration, device=plain(calibration.device), memory=fit(calibration.memory),
                   time=fit(calibration.time), communication=fit(calibration.communication),
                   activations=fit(calibration.activations),
                   measured_on=replace(measured_on, models=tuple(plain(m) for m in measured_on.models),
                                       policies=tuple(plain(p) for p in measured_on.policies)))


def confidence_markdown(calibration: Calibration, plan: Plan | None = None) -> str:
    """The confidence as Markdown: a bold heading over a list, one topic an item
    (headroom.core.measured.calibration.Calibration.confidence_lines), stored text made plain. With ``plan``, an
    item says whether its model, GPU count and policy (the recommendation's, else the pinned candidate's) lie
    inside what was measured."""
    shown = shown_calibration(calibration)
    if plan is None:
        lines = shown.confidence_lines()
    else:
        request, candidate = plan.request, plan.recommendation or plan.pinned
        lines = shown.confidence_lines(plain(request.spec.name), request.gpus or request.train.layout.world,
                                       plain(str(candidate.config.recompute)) if candidate is not None else None)
    return "**Confidence:**\n" + "\n".join(f"- {line}" for line in lines)
