"""Context parallelism's exchange of keys and values: the core's collectives against torch's ring attention on two
and four gloo ranks (tests/distributed/context_parallel.py), call for call, with their bytes and dtypes, under
both of torch's rotate methods; what each stack runs by default, and the setting that picks one."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from headroom.core.errors import ConfigError
from headroom.core.exports import export
from headroom.core.memory.estimate import estimate
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.stack import STACKS
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.dashboard.planning import PlanInputs, build_layout
from tests.distributed.context_parallel import LOCAL_SEQ, MICRO_BATCH, SPEC
from tests.test_export import candidate

LLAMA = get_preset("llama3-8b")

ONE_LAYER = replace(SPEC, name="bench-gpt-one-layer", n_layers=1)


def _predicted(world: int, cp_comm: str) -> Counter:
    """The core's cp terms for one layer and micro-batch, as {(pass, op, local bytes): calls}: an all-gather's
    local bytes are its gathered buffer over the ranks."""
    config = TrainConfig(seq_len=LOCAL_SEQ * world, micro_batch=MICRO_BATCH, precision="bf16-pure",
                         layout=Layout(cp=world, cp_comm=cp_comm))
    calls: Counter = Counter()
    for term in step_communication(ONE_LAYER, config, 1, cluster_for("h100-sxm")):
        if term.axis == "cp":
            local = term.message_bytes // world if term.op == "all_gather" else term.message_bytes
            calls["backward" if "backward" in term.note else "forward", term.op, local] += term.calls
    return calls


def _measured(record: dict, cp_comm: str) -> Counter:
    return Counter((phase, op, nbytes) for phase, op, _, nbytes in record["context_parallel"][cp_comm])


@pytest.mark.parametrize("cp_comm", ["all-gather", "ring"])
def test_two_ranks_exchange_what_the_core_counts(two_ranks, cp_comm):
    for record in two_ranks:
        assert _measured(record, cp_comm) == _predicted(2, cp_comm)


@pytest.mark.slow
@pytest.mark.parametrize("cp_comm", ["all-gather", "ring"])
def test_four_ranks_exchange_what_the_core_counts(four_ranks, cp_comm):
    """Four ranks: the ring passes K and V three times, the gradients four."""
    for record in four_ranks:
        assert _measured(record, cp_comm) == _predicted(4, cp_comm)


def test_the_gradients_of_k_and_v_travel_in_fp32(two_ranks):
    """torch sums dK and dV in fp32 (convert_to_f32) and passes them on so, whatever the compute dtype."""
    calls = two_ranks[0]["context_parallel"]["all-gather"]
    assert {(phase, op, dtype) for phase, op, dtype, _ in calls} == {
        ("forward", "all_gather", "bfloat16"), ("backward", "all_gather", "bfloat16"),
        ("backward", "send_recv", "float32")}


def test_each_stack_runs_its_own_exchange_by_default():
    assert {name: stack.cp_comm for name, stack in STACKS.items()} == {
        "reference": "all-gather", "torchtitan": "all-gather", "megatron": "ring", "hf": "all-gather",
        "hf-liger": "all-gather"}
    assert TrainConfig(seq_len=4096, layout=Layout(cp=2, cp_comm="ring")).cp_comm == "ring"
    with pytest.raises(ConfigError, match="cp-comm ring says how context-parallel ranks exchange keys and values: "
                                          "it needs cp > 1"):
        Layout(cp_comm="ring")
    with pytest.raises(ConfigError, match="cp-comm must be one of ring, all-gather, got 'p2p'"):
        Layout(cp=2, cp_comm="p2p")


def _timed(cp_comm: str):
    config = TrainConfig(seq_len=32768, micro_batch=1, precision="bf16-pure", layout=Layout(cp=4, cp_comm=cp_comm))
    profile = datasheet_profile(get_hardware("h100-sxm"))
    return step_time(estimate(LLAMA, config, "cuda", 2), profile, 2, profile.cluster())


def test_a_gather_hides_behind_the_first_chunk_and_a_pass_behind_each():
    """torch's all-gather is waited for before the second chunk: only the first (local) chunk's attention hides
    it; each pass of the ring hides behind one chunk; the last pass of the gradients hides behind none."""
    gathered, ring = _timed("all-gather"), _timed("ring")
    windows = {o.window: o for o in gathered.overlaps if o.axis == "cp"}
    assert set(windows) == {"attention", "first chunk"}
    assert windows["first chunk"].window_s == pytest.approx(windows["attention"].window_s / 4)
    assert {o.window for o in ring.overlaps if o.axis == "cp"} == {"attention"}
    for time in (gathered, ring):
        last = [t for t in time.communication if t.axis == "cp" and not t.overlappable]
        assert [t.note for t in last] == ["dK and dV passed on per layer backward, fp32, the last hop"]


def test_plan_the_search_and_the_page_take_the_setting(run_cli):
    result = run_cli("plan", "--model", "llama3-8b", "--seq-len", "32768", "--global-batch", "16", "--cp", "4",
                     "--dp", "2", "--zero", "3", "--cp-comm", "ring", "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["recommendation"]
    assert best["layout"]["cp_comm"] == best["cp_comm"] == "ring"
    plain = run_cli("plan", "--model", "llama3-8b", "--seq-len", "32768", "--global-batch", "16", "--cp", "4", "--dp",
                    "2", "--zero", "3")
    assert "context parallel: keys and values gathered once a layer (the reference stack's)" in plain.stdout
    bad = run_cli("plan", "--model", "llama3-8b", "--global-batch", "16", "--cp", "4", "--cp-comm", "p2p")
    assert bad.returncode == 2 and "invalid choice: 'p2p'" in bad.stderr
    train = TrainConfig(seq_len=32768, layout=Layout(cp=2, cp_comm="ring"))
    layouts = candidate_layouts(LLAMA, train, 16, 8, 8, frozenset({"cp_comm"}))
    assert {layout.cp_comm for layout in layouts if layout.cp > 1} == {"ring"}
    assert {layout.cp_comm for layout in layouts if layout.cp == 1} == {None}
    inputs = PlanInputs.from_query({"gpus": "0", "cp": "4", "cp_comm": "ring"})
    assert build_layout(inputs).cp_comm == "ring"


@pytest.mark.parametrize(("stack", "fmt", "cp_comm", "said"), [
    ("megatron", "megatron", "all-gather", "--cp-comm-type allgather"),
    ("megatron", "megatron", "ring", None),  # Megatron-LM's default, p2p
    ("torchtitan", "torchtitan", "ring", "set_rotate_method('alltoall')"),
    ("hf", "hf", "ring", "cp_comm_strategy='alltoall'"),
])
def test_the_exports_carry_the_exchange(stack, fmt, cp_comm, said):
    request, best = candidate(Layout(cp=4, dp=2, zero=3, cp_comm=cp_comm), "full", spec=LLAMA, stack=stack,
                              seq_len=32768)
    exported = export(fmt, request, best)
    text = exported.text + " ".join(exported.notes)
    if said is None:
        assert "--cp-comm-type" not in text
    else:
        assert said in text
