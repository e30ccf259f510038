"""Expert all-to-alls beside another micro-batch's compute (``--ep-overlap``, Megatron-LM's
``--overlap-moe-expert-parallel-comm``): which all-to-alls stay exposed, what hides the rest, what Megatron-LM
refuses with it, and where the setting goes (search, exports, flags, the Plan page). The overlap is the model's,
not measured: Megatron's combined 1F1B has no CPU path."""

from __future__ import annotations

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.dashboard.planning import PlanInputs, build_layout

QWEN = get_preset("qwen3-30b-a3b")
H100 = datasheet_profile(get_hardware("h100-sxm"))
CLUSTER = cluster_for("h100-sxm")


def _config(overlap: bool | None, **changes) -> TrainConfig:
    fields = {"seq_len": 2048, "micro_batch": 2, "stack": "megatron", "recompute": parse_policy("selective"),
              "layout": Layout(dp=16, zero=3, ep=8, ep_overlap=overlap)} | changes
    return TrainConfig(**fields)


@pytest.mark.parametrize("micro_batches", [1, 2, 5])
def test_the_first_forward_and_the_last_backward_stay_exposed(micro_batches):
    """combined_1f1b.py: the first micro-batch's forward runs alone, then each forward beside the previous
    micro-batch's backward, the last backward alone: 4 all-to-alls a layer exposed, 4 (m - 1) beside compute,
    as many in all as without the overlap."""
    def ep(overlap: bool | None):
        return [t for t in step_communication(QWEN, _config(overlap), micro_batches, CLUSTER) if t.axis == "ep"]

    (plain,) = ep(None)
    alone, *beside = ep(True)
    assert plain.calls == 4 * QWEN.moe_layers * micro_batches and not plain.overlappable
    assert (alone.calls, alone.overlappable) == (4 * QWEN.moe_layers, False)
    assert [(t.calls, t.window) for t in beside] == ([((micro_batches - 1) * 4 * QWEN.moe_layers, "other micro-batch")]
                                                     if micro_batches > 1 else [])
    assert sum(t.seconds for t in (alone, *beside)) == pytest.approx(plain.seconds, rel=1e-12)


def test_what_it_hides_comes_off_the_step_and_one_micro_batch_hides_nothing():
    def timed(overlap: bool | None, micro_batches: int):
        config = _config(overlap)
        return step_time(estimate(QWEN, config, "cuda", micro_batches), H100, micro_batches, CLUSTER)

    for m in (2, 4):
        off, on = timed(None, m), timed(True, m)
        (window,) = [o for o in on.overlaps if o.axis == "ep"]
        assert window.window == "other micro-batch"
        assert window.window_s == pytest.approx((m - 1) * (on.forward_s + on.backward_s + on.recompute_s))
        hidden = min(window.communication_s, window.window_s)
        assert off.communication_s - on.communication_s == pytest.approx(hidden, rel=1e-9) and hidden > 0
    assert timed(True, 1).communication_s == pytest.approx(timed(None, 1).communication_s, rel=1e-12)


@pytest.mark.parametrize(("changes", "message"), [
    ({"stack": "reference"}, "--stack reference --ep-overlap on: only megatron"),
    ({"recompute": parse_policy("full")}, "Megatron-LM refuses full, every-K and block-K recomputation"),
    ({"recompute": parse_policy("block-2")}, "with block-2 recompute: Megatron-LM refuses full, every-K and block-K"),
    ({"precision": "fp32"}, "Megatron-LM overlaps the expert all-to-alls of a 16-bit model only"),
])
def test_what_megatron_refuses_with_it_is_refused_by_name(changes, message):
    with pytest.raises(ConfigError, match=message):
        _config(True, **changes).check_model(QWEN)


def test_it_needs_experts_split_over_ranks():
    with pytest.raises(ConfigError, match="ep-overlap runs the experts' all-to-alls .* it needs ep > 1"):
        Layout(dp=2, ep_overlap=True)
    with pytest.raises(ConfigError, match="ep-overlap must be on or off"):
        Layout(ep=2, dp=2, ep_overlap="yes")  # type: ignore[arg-type]


def test_a_pinned_overlap_goes_only_where_experts_are_split():
    train = TrainConfig(seq_len=2048, stack="megatron", recompute=parse_policy("selective"),
                        layout=Layout(ep=2, dp=2, ep_overlap=True))
    layouts = candidate_layouts(QWEN, train, 64, 16, 8, frozenset({"ep_overlap"}))
    assert {layout.ep_overlap for layout in layouts if layout.ep > 1} == {True}
    assert {layout.ep_overlap for layout in layouts if layout.ep == 1} == {None}


def test_exports_carry_it(run_cli):
    flags = ["plan", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--dp", "16", "--zero", "3", "--ep", "8",
             "--stack", "megatron", "--seq-len", "2048", "--global-batch", "128", "--recompute", "selective",
             "--ep-overlap", "on", "--budget", "200GB"]
    megatron = run_cli(*flags, "--export", "megatron")
    assert megatron.returncode == 0, megatron.stderr
    assert "--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm" \
        in megatron.stdout
    titan = run_cli(*flags, "--export", "torchtitan")
    assert titan.returncode == 0, titan.stderr
    assert "torchtitan 0.3 has no overlap of the expert all-to-alls" in " ".join(titan.stdout.split())


def test_the_plan_page_pins_it():
    layout = build_layout(PlanInputs(gpus=16, ep="8", ep_overlap="on"))
    assert (layout.ep, layout.ep_overlap) == (8, True)
