"""block-K: Megatron-LM's ``--recompute-method block`` (``TransformerBlock._checkpointed_forward``): the first K
blocks of each pipeline stage checkpointed one by one, the others run plain. Checked against what autograd saves
and counts on the agent's decoder (CPU), and by composition of full and none elsewhere."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.memory.ledger import activation_ledger
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE_BY_KEY
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import RecomputePolicy, parse_policy
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile, step_floor_s, step_time

H100 = datasheet_profile(HARDWARE_BY_KEY["h100-sxm"])
LLAMA3_8B = get_preset("llama3-8b")


def test_it_reads_and_prints_as_megatrons_count_of_layers():
    policy = parse_policy("block-5")
    assert policy == RecomputePolicy("block", 5) and str(policy) == "block-5"
    assert [policy.recomputed_layers(n) for n in (3, 5, 8)] == [3, 5, 5]
    assert policy.segments(8) == 5 and policy.segment_layers(8) == 1
    with pytest.raises(ConfigError, match="valid: .*block-K"):
        parse_policy("block-0")


def _tiny(block: str, policy: str, precision: str = "bf16-pure", seq_len: int = 32, attention: str = "flash") -> tuple:
    spec = dataclasses.replace(get_preset(f"bench-{block}-tiny"), n_layers=4)
    return spec, TrainConfig(seq_len=seq_len, micro_batch=2, recompute=parse_policy(policy), precision=precision,
                             attention=attention)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("block", ["gpt", "llama"])
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16-pure"])
def test_saved_bytes_equal_what_autograd_saves(k, block, precision):
    pytest.importorskip("torch")
    from tests.probing import probe_config

    spec, config = _tiny(block, f"block-{k}", precision)
    assert activation_ledger(spec, config, "cpu").saved_bytes == probe_config(spec, config, "cpu").activation_bytes


@pytest.mark.parametrize("block", ["gpt", "llama"])
def test_each_checkpointed_block_keeps_its_input_and_the_rest_keep_everything(block):
    """block-K keeps what full keeps of K blocks and what none keeps of the others: each K a block's
    difference less; block-4 of four blocks is full."""
    saved = {policy: activation_ledger(*_tiny(block, policy), "cpu").saved_bytes
             for policy in ("none", "full", "block-1", "block-2", "block-3", "block-4")}
    step = (saved["none"] - saved["full"]) // 4
    assert step > 0 and saved["none"] - saved["full"] == 4 * step
    assert [saved[f"block-{k}"] for k in range(1, 5)] == [saved["none"] - k * step for k in range(1, 5)]


def test_the_checkpointed_blocks_stop_at_k_beside_bf16_end_blocks():
    """Under Megatron's --first-last-layers-bf16 the stage's first block (bf16) is checkpointed by any K and its last
    by none below 32: each further K checkpoints one more fp8 block, the same difference each time (a replay of
    alike blocks once ran on to the bf16 last block, past K)."""
    saved = [estimate(LLAMA3_8B, _megatron(f"block-{k}", fp8="te-current", first_last_bf16=True),
                      "cuda").ledger.saved_bytes for k in range(1, 9)]
    steps = {a - b for a, b in itertools.pairwise(saved)}
    assert len(steps) == 1 and steps.pop() > 0


@pytest.mark.parametrize("block", ["gpt", "llama"])
def test_backward_reaches_the_checkpoints_after_freeing_the_others(block):
    """Measured on CPU, op by op: the backward's peak over what forward kept is none's while K is below the blocks
    (the ledger adds no recompute), where full's is more: its first recompute brings back a block's activations
    (explicit attention, 256 tokens: larger than the loss's gradient)."""
    pytest.importorskip("torch")
    from tests.live_bytes import LiveBytes
    from tests.probing import build, run_forward

    def over_kept(policy: str) -> tuple[int, int]:
        spec, config = _tiny(block, policy, seq_len=256, attention="standard")
        model, tokens, targets = build(spec, config, "cpu")
        with LiveBytes(*model.parameters(), tokens, targets) as live:
            live.mark()
            loss = run_forward(model, tokens, targets, config.precision)
            kept = live.mark()
            loss.backward()
            measured = live.peak - kept
        return measured, activation_ledger(spec, config, "cpu").recompute_bytes

    none, block_2, block_3, full = (over_kept(p) for p in ("none", "block-2", "block-3", "full"))
    assert block_2 == block_3 == (none[0], 0)
    assert full[0] > none[0] and full[1] > 0


@pytest.mark.parametrize("k", [1, 3])
def test_flops_equal_the_flop_counter(k):
    pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from headroom.core.memory.flops import step_flops
    from tests.probing import build

    spec = dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=4)
    # FlopCounterMode counts no CPU fused SDPA kernel: the explicit attention.
    config = TrainConfig(seq_len=24, micro_batch=2, attention="standard", recompute=parse_policy(f"block-{k}"))
    model, tokens, targets = build(spec, config, "cpu")
    with FlopCounterMode(display=False) as counter:
        model(tokens, targets).backward()
    assert counter.get_total_flops() == step_flops(spec, config, "cpu").hardware


DP_8 = Layout(dp=8, zero=1)


def _megatron(policy: str, layout: Layout = DP_8, **changes) -> TrainConfig:
    return TrainConfig(seq_len=8192, micro_batch=1, precision="bf16-master", stack="megatron",
                       recompute=parse_policy(policy), layout=layout, **changes)


def test_each_stage_recomputes_its_first_k_blocks():
    """Megatron reruns whole blocks (no early stop): block-5 on one stage of 32 is 5/32 of full's recompute; over 4
    stages of 8, 4 x 5; block-10 over stages of 8 recomputes every block, as full."""
    full = estimate(LLAMA3_8B, _megatron("full"), "cuda").flops.recompute
    assert estimate(LLAMA3_8B, _megatron("block-5"), "cuda").flops.recompute * 32 == full * 5
    pipeline = Layout(pp=4, dp=2)
    assert estimate(LLAMA3_8B, _megatron("block-5", pipeline), "cuda").flops.recompute * 32 == full * 20
    assert estimate(LLAMA3_8B, _megatron("block-10", pipeline), "cuda").flops.recompute == full


def test_a_step_reruns_k_blocks_of_forward():
    """On one rank the recompute is K of the 32 blocks' forward time, full's K/32; the floor stays under it."""
    cluster = default_cluster("h100-sxm")
    times = {p: step_time(estimate(LLAMA3_8B, _megatron(p), "cuda", 16), H100, 16, cluster)
             for p in ("none", "full", "block-5")}
    assert times["none"].recompute_s == 0 < times["block-5"].recompute_s
    assert times["block-5"].recompute_s * 32 == pytest.approx(times["full"].recompute_s * 5, rel=1e-12)
    assert times["block-5"].forward_s == times["none"].forward_s
    config = _megatron("block-5", Layout(pp=4, dp=2))
    assert 0 < step_floor_s(LLAMA3_8B, config, H100, 16) <= step_time(
        estimate(LLAMA3_8B, config, "cuda", 16), H100, 16, cluster).total_s


def test_tensor_parallel_collectives_run_again_in_the_k_blocks_only():
    """Without sequence parallelism each block all-reduces its two row-parallel outputs forward, and again in the
    recomputed forward of the first K (Megatron: no early stop)."""
    cluster = default_cluster("h100-sxm")

    def all_reduces(policy: str) -> int:
        terms = step_communication(LLAMA3_8B, _megatron(policy, Layout(tp=2, dp=4)), 1, cluster)
        return sum(t.calls for t in terms if t.axis == "tp" and t.op == "all_reduce"
                   and t.message_bytes == 8192 * LLAMA3_8B.hidden * 2)

    assert all_reduces("block-5") - all_reduces("none") == 2 * 5
    assert all_reduces("full") - all_reduces("none") == 2 * 32


def test_where_it_is_refused():
    with pytest.raises(ConfigError, match="the torchtitan stack has no block-5 checkpointing; it offers none, full"):
        TrainConfig(seq_len=2048, stack="torchtitan", recompute=parse_policy("block-5"))
    with pytest.raises(ConfigError, match="block-40 is longer than the model's 32 layers; use block-K with K <= 32"):
        _megatron("block-40").check_model(LLAMA3_8B)


def test_the_megatron_export_sets_the_block_method(run_cli):
    flags = ("--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--hardware", "h100-sxm",
             "--stack", "megatron", "--precision", "bf16-master", "--micro-batch", "1", "--recompute", "block-5",
             "--budget", "200GB")
    exported = run_cli("plan", *flags, "--export", "megatron")
    assert exported.returncode == 0, exported.stderr
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 5" in exported.stdout
    titan = run_cli("plan", *flags[:8], "--stack", "reference", *flags[10:], "--export", "torchtitan")
    assert titan.returncode == 0, titan.stderr
    assert "activation-checkpoint:full" in titan.stdout and "torchtitan has no block-5" in titan.stdout


def test_under_virtual_stages_each_chunk_checkpoints_its_first_k():
    """Megatron-LM runs block-K in each model chunk (each is a TransformerBlock): on 4 stages of 2 chunks of 4
    blocks, block-2 keeps a micro-batch's what block-4 keeps on 4 stages of one 8-block chunk, rank for rank, and
    recomputes half the model; block-4 there is full recompute, its transient included."""
    from headroom.core.memory.pipeline import rank_kinds

    interleaved, plain = Layout(pp=4, schedule="interleaved", virtual_stages=2), Layout(pp=4)
    for chunked, whole in (("block-2", "block-4"), ("block-1", "block-2"), ("block-4", "full")):
        a, b = _megatron(chunked, interleaved), _megatron(whole, plain)
        ranks = zip(rank_kinds(interleaved, a.chunk_layers(LLAMA3_8B), 8),
                    rank_kinds(plain, b.chunk_layers(LLAMA3_8B), 8), strict=True)
        for mine, theirs in ranks:
            assert mine.chunks == (4, 4) and theirs.chunks == ()
            ours, reference = (activation_ledger(LLAMA3_8B, c, rank=r) for c, r in ((a, mine), (b, theirs)))
            assert (ours.saved_bytes, ours.recompute_bytes) == (reference.saved_bytes, reference.recompute_bytes)
    full = estimate(LLAMA3_8B, _megatron("full", interleaved), "cuda", 8).flops.recompute
    assert estimate(LLAMA3_8B, _megatron("block-2", interleaved), "cuda", 8).flops.recompute * 2 == full
    assert _megatron("block-3", interleaved).recomputed_blocks(8) == 6
    cluster = default_cluster("h100-sxm")
    times = {p: step_time(estimate(LLAMA3_8B, _megatron(p, interleaved), "cuda", 8), H100, 8, cluster)
             for p in ("full", "block-2")}
    assert times["block-2"].recompute_s * 2 == pytest.approx(times["full"].recompute_s, rel=1e-12)


EIGHT_H100_FP8 = ("--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "128", "--hardware", "h100-sxm",
                  "--gpus", "8", "--stack", "megatron", "--precision", "bf16-master", "--fp8", "te-current",
                  "--fp8-param-gather", "on", "--first-last-layers-bf16", "on", "--zero", "1", "--dp", "8")


def test_a_megatron_search_picks_the_fewest_blocks_that_fit(run_cli, plan_json):
    """Megatron-Bridge's H100 Llama 3 8B recipe on its distributed optimizer: nothing recomputed does not fit 80 GB,
    full does; the search finds block-12 at micro-batch 1 the fastest, the fewest blocks that fit there (block-11 is
    over the budget, pinned), and faster than full or every-K."""
    plan = plan_json(*EIGHT_H100_FP8)
    best = plan["recommendation"]
    assert (best["recompute"], best["micro_batch"]) == ("block-12", 1)
    others = [c for c in plan["candidates"] if not c["recompute"].startswith("block")]
    assert {c["recompute"] for c in others} >= {"full", "every-2"}
    assert all(c["tokens_per_s"] < best["tokens_per_s"] for c in others)
    pinned = run_cli("plan", *EIGHT_H100_FP8, "--micro-batch", "1", "--recompute", "block-11", "--json", "--top", "0")
    assert pinned.returncode == 3 and json.loads(pinned.stdout)["recommendation"] is None


def test_the_reference_stack_searches_no_block_k(plan_json):
    plan = plan_json("--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "128", "--hardware", "h100-sxm",
                     "--gpus", "8", "--precision", "bf16-master", "--zero", "3", "--dp", "8")
    assert not any(c["recompute"].startswith("block") for c in plan["candidates"] + plan["rejected"])


def test_advice_weighs_a_pinned_block_k(run_cli):
    """Nothing fits one GPU at 60 GB under a pinned block-2: the advice's changes are tried under it (it once judged
    every change by full, every-K and offload alone, none of them the pinned policy, and found none)."""
    result = run_cli("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--hardware",
                     "h100-sxm", "--stack", "megatron", "--micro-batch", "1", "--recompute", "block-2", "--budget",
                     "60GB")
    assert result.returncode == 3, result.stderr
    assert "smallest change that fits: --gpus " in result.stdout and ", block-2 on tp " in result.stdout
