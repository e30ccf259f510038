"""Tensor-parallel collectives beside the GEMMs (Layout.tp_overlap): Megatron-LM's --tp-comm-overlap and torchtitan's
async tensor parallelism. Where it applies, what it hides and what it leaves exposed, and where it goes (flags, the
Plan page, the search, exports)."""

from __future__ import annotations

import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.exports import export
from headroom.core.memory.estimate import estimate
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.dashboard.planning import PlanInputs, build_layout
from tests.test_export import candidate

LLAMA = get_preset("llama3-70b")
H100 = datasheet_profile(get_hardware("h100-sxm"))


def test_it_needs_sequence_parallelism_and_a_stack_that_runs_it():
    with pytest.raises(ConfigError, match="tp-overlap overlaps the all-gathers and reduce-scatters of sequence "
                                          "parallelism with the GEMMs they feed: it needs tp > 1 with --sp on"):
        Layout(tp=8, tp_overlap=True)
    with pytest.raises(ConfigError, match="--stack reference --tp-overlap on: only megatron"):
        TrainConfig(seq_len=4096, layout=Layout(tp=8, sp=True, tp_overlap=True)).check_model(LLAMA)
    for stack in ("megatron", "torchtitan"):
        TrainConfig(seq_len=4096, stack=stack, layout=Layout(tp=8, sp=True, tp_overlap=True)).check_model(LLAMA)
    assert str(Layout(tp=8, sp=True, tp_overlap=False)) == "tp 8 +sp, pp 1, cp 1, dp 1, zero 0, tp not overlapped"


REGATHERED = "per block the 2 sharded norm outputs again in backward"
"""Megatron-LM's backward all-gathers of its sharded norm outputs, beside the input-gradient GEMMs with or without
the overlap (headroom.core.timing.comm._regathered_calls)."""


def _terms(overlap: bool | None):
    config = TrainConfig(seq_len=8192, stack="megatron", layout=Layout(tp=8, sp=True, tp_overlap=overlap))
    return step_communication(LLAMA, config, 4, H100.cluster())


def test_each_blocks_collective_hides_all_but_its_first_piece():
    """The same bytes either way; with the overlap each block's collective is its first 1/tp piece, exposed, and
    the rest beside the GEMMs; the embedding's, head's and loss's stay exposed."""
    plain, beside = _terms(None), _terms(True)
    assert sum(t.total_bytes for t in plain) == sum(t.total_bytes for t in beside)
    assert [t.note.startswith(REGATHERED) for t in plain if t.overlappable] == [True]
    hidden = [t for t in beside if t.overlappable and not t.note.startswith(REGATHERED)]
    assert {t.window for t in hidden} == {"matmuls"} and len(hidden) == 4  # sp: 2 all-gathers, 2 reduce-scatters
    for t in hidden:
        first = next(f for f in beside if f.note.startswith(t.note.split(";")[0]) and not f.overlappable)
        assert first.message_bytes * 8 == t.message_bytes + first.message_bytes  # 1 of 8 pieces
        assert first.calls == t.calls and "the first of its 8 pieces" in first.note
    blocks = {t.note for t in plain if t.note.startswith("per block")}
    assert {t.note for t in beside if not t.note.startswith("per block")} == {t.note for t in plain} - blocks


def test_the_gemms_hide_the_rest_and_the_step_says_how_close():
    def timed(overlap):
        config = TrainConfig(seq_len=8192, stack="megatron", layout=Layout(tp=8, sp=True, tp_overlap=overlap),
                             recompute=parse_policy("full"))
        return step_time(estimate(LLAMA, config, "cuda", 4), H100, 4, H100.cluster())

    plain, beside = timed(None), timed(True)
    (regathers,) = plain.overlaps  # without the overlap, Megatron's backward re-gathers alone hide
    assert regathers.communication_s == pytest.approx(sum(t.seconds for t in plain.communication if t.overlappable))
    (tp,) = [o for o in beside.overlaps if o.axis == "tp"]
    assert tp.window == "matmuls" and 0 < tp.communication_s < tp.window_s  # hidden, with slack to spare
    first = sum(t.seconds for t in beside.communication if not t.overlappable)
    assert beside.communication_s == pytest.approx(first)
    assert beside.communication_s < plain.communication_s / 4
    assert beside.total_s < plain.total_s


def test_the_search_carries_it_to_layouts_with_sequence_parallelism():
    train = TrainConfig(seq_len=8192, stack="megatron", layout=Layout(tp=2, sp=True, tp_overlap=True))
    layouts = candidate_layouts(LLAMA, train, 64, 16, 8, frozenset({"tp_overlap"}))
    assert {layout.tp_overlap for layout in layouts if layout.sp} == {True}
    assert {layout.tp_overlap for layout in layouts if not layout.sp} == {None}  # tp 1: nothing to overlap


def test_plan_takes_the_flag(run_cli):
    base = ("plan", "--model", "llama3-70b", "--seq-len", "8192", "--global-batch", "64", "--tp", "8", "--sp", "on",
            "--dp", "2", "--pp", "4", "--stack", "megatron")
    result = run_cli(*base, "--tp-overlap", "on", "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["recommendation"]
    assert best["layout"]["tp_overlap"] is True
    assert [o["window"] for o in best["overlap"] if o["axis"] == "tp"] == ["matmuls"]
    refused = run_cli(*base[:-2], "--tp-overlap", "on")
    assert refused.returncode == 2 and "--stack reference --tp-overlap on: only megatron" in refused.stderr


def test_the_plan_page_pins_it():
    inputs = PlanInputs.from_query({"gpus": "0", "tp": "8", "sp": "on", "tp_overlap": "on", "stack": "megatron"})
    assert inputs.tp_overlap == "on" and build_layout(inputs).tp_overlap is True


@pytest.mark.parametrize(("fmt", "said"), [
    ("megatron", "--tp-comm-overlap"),
    ("torchtitan", "--compile.enable_async_tensor_parallel"),
    ("deepspeed", "DeepSpeed's AutoTP has no overlap of tensor-parallel collectives with the GEMMs"),
    ("hf", "transformers has no overlap of tensor-parallel collectives with the GEMMs"),
    ("lightning", "Lightning's ModelParallelStrategy has no overlap of tensor-parallel collectives"),
])
def test_each_export_carries_it_or_says_it_cannot(fmt, said):
    request, best = candidate(Layout(tp=8, sp=True, dp=2, tp_overlap=True), "full", spec=LLAMA, stack="megatron")
    exported = export(fmt, request, best)
    assert said in exported.text + " ".join(exported.notes)
