"""The zero-bubble ZB-V schedule: its table against torch's, its replay against closed forms and whole replays,
the chunks a rank holds and keeps in flight, the stacks that run it, and where it goes (flags, search, exports).
Its memory is measured on gloo ranks of torch's own ScheduleZBVZeroBubble in tests/test_multi_rank.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)
from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble
from torch.distributed.pipelining.schedules import _ComputationType as Torch
from torch.utils.flop_counter import FlopCounterMode

from headroom.agent.model import Decoder
from headroom.agent.pipeline_stages import Stage
from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate, for_rank
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.schedule_order import (
    Action,
    alive_peaks,
    zbv_alive,
    zbv_chunks,
    zbv_order,
)
from headroom.core.specs.stages import chunk_layers, rank_chunks, stage_layers
from headroom.core.timing import step as step_module
from headroom.core.timing.schedule_replay import replay, zbv_makespan
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.core.timing.step_ops import forward_ops
from headroom.dashboard.planning import PlanInputs, build_layout

LLAMA = get_preset("llama3-8b")  # 32 layers
H100 = datasheet_profile(get_hardware("h100-sxm"))
ZBV = {"schedule": "zbv", "virtual_stages": 2}
KINDS = {Torch.FORWARD: "F", Torch.BACKWARD_INPUT: "I", Torch.BACKWARD_WEIGHT: "W"}


def _torch_order(pp: int, micro_batches: int) -> tuple[tuple[Action, ...], ...]:
    """torch's own table: ScheduleZBVZeroBubble's per-rank actions, computed without building stages."""
    schedule = SimpleNamespace(pp_group_size=pp, num_stages=2 * pp, _n_microbatches=micro_batches)
    return tuple(
        tuple(Action(KINDS[a.computation_type], a.stage_index, a.microbatch_index)
              for a in ScheduleZBVZeroBubble._calculate_single_rank_operations(schedule, rank) if a is not None)
        for rank in range(pp))


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6, 8])
def test_the_table_is_torchs_rank_for_rank(pp):
    for micro_batches in range(1, 3 * pp + 2):  # below 2 pp - 1 torch plans more and drops the extra
        assert zbv_order(pp, micro_batches) == _torch_order(pp, micro_batches), micro_batches


def test_each_rank_holds_its_own_chunk_and_its_mirror():
    assert [zbv_chunks(4, rank) for rank in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert {a.chunk for a in zbv_order(4, 8)[1]} == {1, 6}


@pytest.mark.parametrize("pp", [2, 3, 5, 8])
def test_from_two_micro_batches_a_rank_on_the_moments_of_peak_only_repeat(pp):
    """What zbv_alive relies on: past 2 pp micro-batches the steady phase adds no new moment."""
    for rank in range(pp):
        moments = set(zbv_alive(pp, 2 * pp, rank))
        for micro_batches in range(2 * pp, 6 * pp):
            assert set(alive_peaks(zbv_order(pp, micro_batches)[rank], zbv_chunks(pp, rank))) == moments


def test_every_rank_keeps_pp_micro_batches_of_its_blocks_in_flight():
    """Qi et al. 2024, Sec. 6: ZB-V's peak activation memory is pM_B on every rank, as 1F1B's first stage; with
    equal chunks, 2 pp chunk-micro-batches alive at once."""
    for pp in (2, 4, 8):
        for rank in range(pp):
            assert max(sum(moment) for moment in zbv_alive(pp, 4 * pp, rank)) == 2 * pp


def _one_f_one_b(pp: int, micro_batches: int) -> tuple[tuple[Action, ...], ...]:
    """1F1B as a table (Narayanan et al. 2021, Sec. 2.2.1): stage i warms up with pp - i - 1 forwards, then
    alternates a forward and a whole backward (``I`` here, its weights' part taking no time)."""
    order = []
    for stage in range(pp):
        warm = min(pp - stage - 1, micro_batches)
        actions = [Action("F", stage, mb) for mb in range(warm)]
        for mb in range(micro_batches - warm):
            actions += [Action("F", stage, warm + mb), Action("I", stage, mb)]
        actions += [Action("I", stage, mb) for mb in range(micro_batches - warm, micro_batches)]
        order.append(tuple(actions))
    return tuple(order)


@pytest.mark.parametrize(("pp", "micro_batches"), [(2, 4), (4, 4), (4, 16), (8, 32)])
def test_the_replay_of_1f1b_takes_narayanans_m_plus_pp_minus_1_micro_batches(pp, micro_batches):
    """Alike stages, forward 1 and backward 2: (m + pp - 1)(t_F + t_B), every stage idle (pp - 1)(t_F + t_B)."""
    run = replay(_one_f_one_b(pp, micro_batches), lambda kind, chunk: {"F": 1.0, "I": 2.0, "W": 0.0}[kind])
    assert run.makespan_s == (micro_batches + pp - 1) * 3
    assert [run.idle_s(stage) for stage in range(pp)] == [(pp - 1) * 3] * pp


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_zbv_with_alike_actions_idles_a_sixth_of_1f1b(pp):
    """Forward, input and weight gradient one unit each: the last rank's first forward waits for the pp - 1
    chunks before it, and past that nobody waits, so every rank idles pp - 1 units against 1F1B's 6 (pp - 1)
    for the same two chunks' work (each micro-batch 6 units a rank)."""
    micro_batches = 4 * pp
    run = replay(zbv_order(pp, micro_batches), lambda kind, chunk: 1.0)
    assert run.makespan_s == 6 * micro_batches + pp - 1
    assert run.busy_s == (6.0 * micro_batches,) * pp


def test_a_table_that_never_runs_what_it_needs_is_refused():
    with pytest.raises(ValueError, match="never"):
        replay(((Action("F", 1, 0),),), lambda kind, chunk: 1.0)
    deadlocked = ((Action("F", 0, 0), Action("I", 0, 0)), (Action("I", 1, 0), Action("F", 1, 0)))
    with pytest.raises(ValueError, match="deadlocks"):
        replay(deadlocked, lambda kind, chunk: 1.0)


def test_a_long_step_carried_on_at_the_busiest_ranks_pace_never_under_counts():
    """zbv_makespan replays the first micro-batches and carries on at the busiest rank's pace: on chunk times up
    to twice as uneven as any split makes, never less than the whole replay and at most 1.5% more."""
    rng = random.Random(3)
    for _ in range(60):
        pp = rng.randint(2, 8)
        spread = rng.choice([0.05, 0.2, 0.5, 1.0])
        times = {(kind, chunk): rng.uniform(1 - 0.9 * spread, 1 + spread) * {"F": 1.0, "I": 1.3, "W": 0.7}[kind]
                 for chunk in range(2 * pp) for kind in "FIW"}
        micro_batches = rng.choice([8 * pp, 16 * pp, 64])
        whole = replay(zbv_order(pp, micro_batches), lambda kind, chunk, times=times: times[kind, chunk]).makespan_s
        carried = zbv_makespan(pp, micro_batches, lambda kind, chunk, times=times: times[kind, chunk])
        assert whole * (1 - 1e-12) <= carried <= 1.015 * whole  # the first to rounding: the same sums, reordered


@pytest.mark.parametrize(("name", "tp", "pp"), [("llama3-8b", 1, 4), ("llama3-70b", 8, 8), ("llama3.1-405b", 8, 16)])
def test_on_real_models_the_carried_on_step_is_the_whole_replay(monkeypatch, name, tp, pp):
    """The step time's zero-bubble wait, from each chunk's own times: what zbv_makespan returns equals the whole
    table replayed, to rounding, at 256 micro-batches."""
    seen = []

    def checked(pp_, micro_batches, seconds):
        carried = zbv_makespan(pp_, micro_batches, seconds)
        seen.append((carried, replay(zbv_order(pp_, micro_batches), seconds).makespan_s))
        return carried

    monkeypatch.setattr(step_module, "zbv_makespan", checked)
    config = TrainConfig(seq_len=8192, stack="torchtitan", recompute=parse_policy("full"),
                         layout=Layout(tp=tp, sp=tp > 1, pp=pp, **ZBV))
    step_time(estimate(get_preset(name), config, "cuda", 256), H100, 256, cluster_for("h100-sxm"))
    (carried, whole), = seen
    assert carried == pytest.approx(whole, rel=1e-12)


def test_torchtitan_places_its_split_in_a_v():
    """torchtitan deals 34 weights over 8 chunks (4,5,4,4,4,4,4,3) and puts chunks i and 7 - i on rank i."""
    layout = Layout(pp=4, **ZBV)
    assert chunk_layers(layout, 32, "torchtitan") == (4, 5, 4, 4, 4, 4, 4, 3)
    assert [rank_chunks(layout, rank) for rank in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert stage_layers(layout, 32, "torchtitan") == (7, 9, 8, 8)


def test_the_first_rank_holds_the_embedding_and_the_head():
    config = TrainConfig(seq_len=8192, stack="torchtitan", layout=Layout(pp=4, **ZBV))
    kinds = {k.rank.name: k.rank for k in estimate(LLAMA, config, "cuda", 8).ranks}
    assert list(kinds) == ["first and last stages", "middle stage 1", "middle stage 2"]
    first = kinds["first and last stages"]
    assert (first.stage, first.layers, first.first, first.last) == (0, 7, True, True)
    assert kinds["middle stage 2"].in_flight == 4  # two chunks of 4 blocks alike: pp micro-batches
    # the head's chunk runs each micro-batch's loss and both gradients at once: one micro-batch of logits
    assert first.logits_count == 1 and first.in_flight < 4


def test_the_first_ranks_peak_counts_its_head_once():
    """Rank 0 of pp 4 over 8 micro-batches peaks holding 7 micro-batches of its first chunk (the embedding and 4
    blocks) and 1 of its last (4 blocks and the head, whose logits outweigh a chunk of blocks): the
    log-probabilities once, and autocast's bf16 weight copies 7 x 4 blocks' and 1 x (4 blocks' and the head's)."""
    config = TrainConfig(seq_len=8192, layout=Layout(pp=4, **ZBV))  # amp-bf16: autocast copies each weight
    first = for_rank(estimate(LLAMA, config, "cuda", 8), 0)
    assert first.rank.logits_count == 1 and first.logits_bytes == first.ledger.probability_bytes
    h, kv, ffn = LLAMA.hidden, LLAMA.n_kv_heads * LLAMA.head_dim, LLAMA.ffn_hidden
    block = 2 * (2 * h * h + 2 * h * kv + 3 * h * ffn)
    head = 2 * LLAMA.vocab_size * h
    assert first.weight_copy_bytes == 7 * 4 * block + (4 * block + head)


@pytest.mark.parametrize(("stack", "message"), [
    ("megatron", "megatron has no zero-bubble schedule: use --schedule 1f1b or interleaved, or --stack torchtitan"),
    ("hf", "the HF Trainer has no pipeline schedule"),
])
def test_stacks_without_it_refuse_it_by_name(stack, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(seq_len=4096, stack=stack, layout=Layout(pp=2, **ZBV)).check_model(LLAMA)


@pytest.mark.parametrize(("layout", "message"), [
    ({"pp": 2, "schedule": "zbv", "virtual_stages": 3}, "the zbv schedule puts 2 model chunks on each pipeline rank"),
    ({"pp": 2, "schedule": "zbv", "virtual_stages": 2, "stage_layers": (16, 16)},
     "the zbv schedule splits the layers over its chunks itself: leave stage layers out"),
])
def test_a_zbv_layout_it_cannot_run_is_refused_by_name(layout, message):
    with pytest.raises(ConfigError, match=message):
        Layout(**layout)


def test_its_wait_is_a_fraction_of_1f1bs():
    cluster = cluster_for("h100-sxm")

    def bubble(schedule: str, v: int) -> float:
        config = TrainConfig(seq_len=8192, stack="torchtitan",
                             layout=Layout(pp=4, schedule=schedule, virtual_stages=v))
        return step_time(estimate(LLAMA, config, "cuda", 32), H100, 32, cluster).bubble_s

    assert 0 < bubble("zbv", 2) < bubble("interleaved", 2) / 5 < bubble("1f1b", 1) / 5


def test_the_search_tries_it_where_the_stack_names_it():
    def schedules(stack: str) -> set[str]:
        train = TrainConfig(seq_len=8192, stack=stack)
        return {layout.schedule for layout in candidate_layouts(LLAMA, train, 64, 8, 8, frozenset())}

    assert schedules("torchtitan") == {"1f1b", "interleaved", "zbv"}
    assert schedules("reference") == {"1f1b", "interleaved"}  # pinned only
    assert schedules("megatron") == {"1f1b", "interleaved"}


def test_plan_takes_it_and_says_how_the_chunks_sit(run_cli):
    result = run_cli("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--pp", "4",
                     "--schedule", "zbv", "--stack", "torchtitan", "--seq-len", "8192", "--global-batch", "32")
    assert result.returncode == 0, result.stderr
    assert "pp 4 (zbv)" in result.stdout
    assert ("rank i holds chunks i and 2 pp - 1 - i: 4+3, 5+4, 4+4, 4+4" in " ".join(result.stdout.split()))


def test_exports_carry_it(run_cli):
    flags = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "4", "--pp", "4", "--schedule",
             "zbv", "--stack", "torchtitan", "--seq-len", "4096", "--global-batch", "16", "--recompute", "full"]
    titan = run_cli(*flags, "--export", "torchtitan")
    assert titan.returncode == 0, titan.stderr
    assert "--parallelism.pipeline_parallel_schedule ZBVZeroBubble" in titan.stdout
    assert "module_fqns_per_model_part" not in titan.stdout  # torchtitan's own split, placed in a V by itself
    megatron = run_cli(*flags, "--export", "megatron")
    assert megatron.returncode == 0, megatron.stderr
    assert "--num-layers-per-virtual-pipeline-stage 5" in megatron.stdout
    assert "Megatron-LM has no zero-bubble schedule" in " ".join(megatron.stderr.split())


def test_the_plan_page_pins_it():
    layout = build_layout(PlanInputs(gpus=8, pp="4", schedule="zbv"))
    assert (layout.schedule, layout.virtual_stages) == ("zbv", 2)


@pytest.mark.parametrize(("name", "attention"), [("bench-llama-tiny", "flash"), ("bench-llama-tiny", "standard"),
                                                 ("bench-gpt-tiny", "standard")])
def test_the_weight_gradient_is_the_work_torchs_split_backward_leaves_to_w(name, attention):
    """torch's pipelining splits a stage's backward as ZB-V runs it (stage_backward_input, then
    stage_backward_weight): FlopCounterMode counts, in the weights' pass, exactly the FLOPs of the GEMMs the time
    model calls the weights' gradient (each linear layer's, none of the attention core's), and in the input's pass
    those again (each linear layer's input gradient) plus twice the attention core's."""
    spec = get_preset(name)
    torch.manual_seed(0)
    decoder = Decoder(spec, attention=attention, dropout=0.0, recompute=parse_policy("none"), stack="reference")
    chunk = Stage(decoder.train(), 1, (0, spec.n_layers, 0), autocast=False)  # every block, no embedding or head
    x = torch.randn(2, 64, spec.hidden, requires_grad=True)
    out = chunk(x)
    with FlopCounterMode(display=False) as input_pass:
        _, groups = stage_backward_input([out], [torch.randn_like(out)], [x], iter(list(chunk.parameters())))
    with FlopCounterMode(display=False) as weight_pass:
        stage_backward_weight(iter(list(chunk.parameters())), groups)
    config = TrainConfig(seq_len=64, micro_batch=2, precision="fp32", attention=attention)
    ops = forward_ops(spec, config, "cpu", spec.n_layers, first=False, last=False)

    def flops(core: bool) -> int:
        return sum(n * sum(op.flops for op in block if op.kind == "gemm" and op.attention_core == core)
                   for block, n in ops.blocks)

    assert weight_pass.get_total_flops() == flops(False) > 0
    assert input_pass.get_total_flops() == flops(False) + 2 * flops(True)
