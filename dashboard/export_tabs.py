"""The Plan page's export tabs: which framework's settings it opens on, and which it marks approximate.

Streamlit opens the first tab. A format that cannot carry the chosen layout (the HF Trainer has no pipeline,
DeepSpeed's config no pipeline or ring attention, Lightning no pipeline, context or expert parallel strategy)
should not be the one a user copies without looking, so the tabs are ordered by what each exporter says it
cannot express (headroom.core.exports: one note per setting it writes differently from the plan):

1. formats that express the layout before those that do not (an export's ``unexpressed`` axes, each of which
   one of its notes names);
2. then fewest notes first;
3. ties in headroom.core.exports.EXPORTERS's order.

A tab whose format cannot express the layout is labelled "hf (approximate)".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from headroom.core.exports import EXPORTERS, Export, export, fp8_refusal
from headroom.core.planning.planner import Candidate, PlanRequest


@dataclass(frozen=True, slots=True)
class ExportTab:
    """One tab: the format, its label, and the export it shows."""

    format: str
    label: str
    """The format's name, with " (approximate)" when it cannot express the layout."""
    exported: Export

    @property
    def expresses_layout(self) -> bool:
        return expresses_layout(self.exported)


def expresses_layout(exported: Export) -> bool:
    """Whether ``exported``'s format has a setting for every parallel axis of the plan's layout."""
    return not exported.unexpressed


def ordered_tabs(exports: Sequence[Export]) -> list[ExportTab]:
    """``exports`` (in EXPORTERS order) as tabs: those that express the layout first, then fewest notes, ties
    kept in the given order; a format that cannot express the layout is labelled approximate."""
    ranked = sorted(enumerate(exports), key=lambda pair: (not expresses_layout(pair[1]), len(pair[1].notes),
                                                          pair[0]))
    return [ExportTab(e.format, e.format if expresses_layout(e) else f"{e.format} (approximate)", e)
            for _, e in ranked]


def export_tabs(request: PlanRequest, best: Candidate) -> tuple[list[ExportTab], list[str]]:
    """Every format's export of ``best`` (a candidate of ``request``'s plan), as the page's tabs in order, and why
    each format that refuses it does (one that cannot carry its FP8 recipe, headroom.core.exports)."""
    exports, refused = [], []
    for fmt in EXPORTERS:
        if (reason := fp8_refusal(fmt, best)) is not None:
            refused.append(f"no {fmt} tab: {reason} (the plan's fp8 recipe is {best.config.fp8})")
            continue
        exports.append(export(fmt, request, best))
    return ordered_tabs(exports), refused
