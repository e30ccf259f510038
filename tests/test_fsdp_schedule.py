"""FSDP2's resharding and gradient-sync settings: the core's collectives and gathered memory against FSDP2 on
gloo ranks (tests/distributed/fsdp_schedule.py: torchtitan's units, a step of two micro-batches).

For each setting the core's data-parallel terms (headroom.core.timing.comm) must make, pass by pass, the calls
FSDP2's all-gathers and reduce-scatters made (one a unit) and move the bytes they moved, and its memory (headroom.core.memory.estimate) must hold what
FSDP2 held gathered in forward and kept unreduced between micro-batches, to the byte.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")

from headroom.core.memory.estimate import estimate  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.interconnect import cluster_for  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.timing.comm import step_communication  # noqa: E402
from tests.distributed.data_parallel import MICRO_BATCH, SEQ_LEN  # noqa: E402
from tests.distributed.fsdp_schedule import MICRO_BATCHES, SCHEDULE_SPEC, cases  # noqa: E402


def _config(world: int, settings: dict) -> TrainConfig:
    return TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision="amp-bf16",
                       stack="torchtitan", layout=Layout(dp=world, zero=3, **settings))


def _measured_bytes(case: dict) -> Counter:
    """Bytes each kind of collective moved in the step, by (pass, op): forward or backward, all micro-batches."""
    moved: Counter = Counter()
    for phase, op, nbytes in case["calls"]:
        moved[phase.split()[0], op] += nbytes
    return moved


def _predicted_bytes(world: int, settings: dict) -> Counter:
    """The core's data-parallel bytes of the step, by (window, op); each term over the ranks it names."""
    config = _config(world, settings)
    kept_over = settings["reshard_after_forward"]
    moved: Counter = Counter()
    for term in step_communication(SCHEDULE_SPEC, config, MICRO_BATCHES, cluster_for("cpu", world)):
        again = term.window == "backward" and term.op == "all_gather"
        assert term.group_size == (kept_over if again and not isinstance(kept_over, bool) else world)
        moved[term.window, term.op] += term.total_bytes
    return moved


def _measured_calls(case: dict) -> Counter:
    """Calls of each kind of collective in the step, by (pass, op)."""
    return Counter((phase.split()[0], op) for phase, op, _ in case["calls"])


def _predicted_calls(world: int, settings: dict) -> Counter:
    """The core's data-parallel calls of the step, by (window, op): one a unit, as FSDP2 issues them."""
    called: Counter = Counter()
    for term in step_communication(SCHEDULE_SPEC, _config(world, settings), MICRO_BATCHES, cluster_for("cpu", world)):
        called[term.window, term.op] += term.calls
    return called


def _passes(case: dict, op: str) -> list[str]:
    """The passes (``forward 0``, ``backward 1``, ...) that ran ``op``, in order."""
    return sorted({phase for phase, name, _ in case["calls"] if name == op})


def _check(records: list[dict]) -> None:
    for record in records:
        measured = record["fsdp_schedule"]
        world = measured["world_size"]
        assert set(measured["cases"]) == set(cases(world))
        for name, case in measured["cases"].items():
            settings = case["settings"]
            assert _measured_bytes(case) == _predicted_bytes(world, settings), name
            assert _measured_calls(case) == _predicted_calls(world, settings), name
            predicted = estimate(SCHEDULE_SPEC, _config(world, settings), "cpu", MICRO_BATCHES)
            forward, _ = predicted.gathered_parameter_bytes
            assert forward == max(case["gathered"][f"forward {m}"] for m in range(MICRO_BATCHES)), name
            assert predicted.deferred_gradient_bytes == case["accumulated_grad_bytes"], name


def test_each_setting_moves_and_holds_what_the_core_says_on_two_ranks(two_ranks):
    _check(two_ranks)


@pytest.mark.slow
def test_a_shard_kept_over_two_of_four_ranks(four_ranks):
    """``reshard_after_forward=2`` on four ranks: backward gathers over the two ranks a shard was kept over."""
    _check(four_ranks)
    case = four_ranks[0]["fsdp_schedule"]["cases"]["shard over 2"]
    assert _passes(case, "all_gather") == ["backward 0", "backward 1", "forward 0", "forward 1"]


def test_the_settings_change_what_fsdp_runs(two_ranks):
    """Measured, before any prediction: kept units are not gathered again in backward, deferred gradients are
    reduce-scattered in the last backward alone and kept unreduced, in fp32, in between."""
    cases_ = two_ranks[0]["fsdp_schedule"]["cases"]
    units = cases_["resharded"]["unit_parameters"]
    assert _passes(cases_["resharded"], "all_gather") == ["backward 0", "backward 1", "forward 0", "forward 1"]
    assert _passes(cases_["kept"], "all_gather") == ["forward 0", "forward 1"]
    assert _passes(cases_["resharded"], "reduce_scatter") == ["backward 0", "backward 1"]
    assert _passes(cases_["deferred"], "reduce_scatter") == ["backward 1"]
    assert cases_["deferred"]["accumulated_grad_bytes"] == 4 * sum(units.values())
    assert cases_["resharded"]["accumulated_grad_bytes"] == 0
    # Resharded, forward holds at most one unit's buffer and its copy: the head's, the largest.
    assert cases_["resharded"]["gathered"]["forward 0"] == 2 * 2 * max(units.values())
