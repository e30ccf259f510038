"""The Plan page's export tabs open on a format that expresses the chosen layout
(headroom.dashboard.export_tabs)."""

from __future__ import annotations

import pytest

from headroom.core.exports import EXPORTERS, Export
from headroom.dashboard import planning
from headroom.dashboard.export_tabs import export_tabs, ordered_tabs


def exported(fmt: str, *notes: str, unexpressed: tuple[str, ...] = ()) -> Export:
    return Export(format=fmt, text="", notes=notes, notes_in_text=False, unexpressed=unexpressed)


def test_tabs_put_the_layout_first_then_fewest_notes_then_the_exporters_order():
    tabs = ordered_tabs([exported("hf", "pp", unexpressed=("pp",)), exported("torchtitan", "a", "b"),
                         exported("megatron", "a"), exported("deepspeed", "a"),
                         exported("lightning", "pp", unexpressed=("pp",))])
    assert [t.label for t in tabs] == ["megatron", "deepspeed", "torchtitan", "hf (approximate)",
                                       "lightning (approximate)"]
    assert [t.expresses_layout for t in tabs] == [True, True, True, False, False]
    assert [t.label for t in ordered_tabs([exported(f) for f in EXPORTERS])] == list(EXPORTERS)  # all equal


CASES = {
    # one GPU: every format expresses it; the notes are about the stack, precision and launch
    "tp 1, pp 1, cp 1, dp 1, zero 0": ["lightning", "hf", "torchtitan", "deepspeed", "megatron"],
    # pipeline and context parallelism: no setting in the HF Trainer, DeepSpeed's config or Lightning
    # (Lightning, the HF Trainer and DeepSpeed also say how they count the pipeline or context ranks in the batch)
    "tp 1, pp 2 (1f1b), cp 1, dp 1, zero 0": ["torchtitan", "megatron", "lightning (approximate)",
                                              "hf (approximate)", "deepspeed (approximate)"],
    "tp 1, pp 1, cp 2, dp 1, zero 0": ["torchtitan", "megatron", "lightning (approximate)", "hf (approximate)",
                                       "deepspeed (approximate)"],
    # tensor parallelism: TrainingArguments has none (transformers sets it when the model loads)
    "tp 2, pp 1, cp 1, dp 1, zero 0": ["deepspeed", "lightning", "torchtitan", "megatron", "hf (approximate)"],
}
PINS = {"tp 1, pp 1, cp 1, dp 1, zero 0": {}, "tp 1, pp 2 (1f1b), cp 1, dp 1, zero 0": {"pp": "2"},
        "tp 1, pp 1, cp 2, dp 1, zero 0": {"cp": "2"}, "tp 2, pp 1, cp 1, dp 1, zero 0": {"tp": "2"}}


@pytest.mark.parametrize("layout", CASES)
def test_the_page_opens_on_a_format_that_expresses_the_layout(layout):
    """llama3.2-1b on the default H100 datasheet row, one layout each: the exporters' own notes order the tabs."""
    inputs = planning.PlanInputs.from_query(PINS[layout])
    profile, calibration = planning.datasheet_hardware(inputs.hardware)
    plan = planning.make_plan(inputs, planning.resolve_preset(inputs.model), profile, calibration)
    best = plan.recommendation
    assert str(best.layout) == layout
    tabs, refused = export_tabs(plan.request, best)
    assert refused == []
    assert [t.label for t in tabs] == CASES[layout]
    pinned = "".join(f"{axis} {value}" for axis, value in PINS[layout].items())
    for tab in tabs:  # approximate exactly where the format has no setting for the pinned axis, which a note names
        assert tab.exported.unexpressed == ((next(iter(PINS[layout])),) if tab.label.endswith("(approximate)")
                                            else ())
        assert not tab.exported.unexpressed or any(pinned in note for note in tab.exported.notes)
