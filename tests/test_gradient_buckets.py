"""Gradient buckets (headroom.core.timing.gradient_buckets): Megatron-LM's rule worked by hand, the rank's tensors,
and one collective call a bucket in a step's communication. DDP's buckets are held against torch's reducer on
gloo ranks in tests/test_distributed_memory.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from headroom.core.memory.pipeline import first_rank, rank_kinds
from headroom.core.memory.static import (
    rank_expert_parameters,
    rank_parameters,
    rank_tensors,
)
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.stages import chunk_layers
from headroom.core.timing.comm import step_communication
from headroom.core.timing.gradient_buckets import (
    gradient_buckets,
    greedy_buckets,
    megatron_bucket_parameters,
    megatron_tensors,
)


def test_a_bucket_closes_at_its_limit_and_a_large_tensor_is_one_of_its_own():
    # Megatron-LM's walk (_compute_default_per_buffer_param_layout): 30M + 15M reach 40M, close at 45M; 5M + 50M
    # close at 55M; the last 1M is a bucket of its own.
    assert greedy_buckets([30, 15, 5, 50, 1], (40,)) == [45, 55, 1]
    # DDP's: a first limit, then the rest's.
    assert greedy_buckets([1, 1, 3, 2, 4, 1], (2, 4)) == [2, 5, 4, 1]
    assert greedy_buckets([], (4,)) == []


def test_megatron_grows_its_buckets_with_the_data_parallel_ranks():
    assert megatron_bucket_parameters(8) == 40_000_000
    assert megatron_bucket_parameters(40) == 40_000_000
    assert megatron_bucket_parameters(64) == 64_000_000


@pytest.mark.parametrize(("model", "layout"), [
    ("llama3-8b", Layout(dp=8)),
    ("llama3-70b", Layout(tp=8, sp=True, pp=4, dp=2)),
    ("qwen3-30b-a3b", Layout(dp=16, ep=16)),
    ("gpt2-small", Layout(tp=4, pp=2, dp=2)),  # biases: q, k, v and up split by tp, the output's and down's whole
])
def test_a_ranks_tensors_are_its_parameters(model, layout):
    spec = get_preset(model)
    for rank in rank_kinds(layout, chunk_layers(layout, spec.n_layers, "reference"), 8):
        experts = rank_expert_parameters(spec, layout, rank) if layout.ep > 1 else 0
        assert sum(rank_tensors(spec, layout, rank)) == rank_parameters(spec, layout, rank) - experts
        assert sum(rank_tensors(spec, layout, rank, experts=True)) == experts


def test_one_call_a_bucket_under_megatrons_distributed_optimizer():
    spec = get_preset("llama3-8b")
    layout = Layout(dp=16, zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    config = TrainConfig(seq_len=4096, precision="bf16-fp32grad", stack="megatron", layout=layout)
    terms = step_communication(spec, config, 4, default_cluster("h100-sxm"))
    weights, rest = megatron_tensors(spec, layout, first_rank(layout, spec.n_layers))
    assert sum(weights) + sum(rest) == spec.parameters
    assert len(weights) == 4 * spec.n_layers and len(rest) == 2 * spec.n_layers + 3  # norms; embedding, head
    buckets = len(greedy_buckets(list(reversed(weights + rest)), (40_000_000,)))
    assert buckets == 98  # q, k and v one tensor and gate with up: 130 with the agent's separate ones
    assert [(t.op, t.calls) for t in terms] == [("reduce_scatter", buckets), ("all_gather", buckets)]
    total = spec.parameters * 4  # fp32 gradients, reduce-scattered once a step
    assert math.ceil(total / buckets) == terms[0].message_bytes
    # Without overlap Megatron-LM makes one bucket of everything (bucket_size None).
    single = TrainConfig(seq_len=4096, precision="bf16-fp32grad", stack="megatron", layout=Layout(dp=16, zero=1))
    assert [t.calls for t in step_communication(spec, single, 4, default_cluster("h100-sxm"))] == [1, 1]


def test_megatron_buckets_the_first_stages_first_chunk_only():
    """Megatron-LM's later pipeline stages and chunks after the first are one bucket a buffer (its fp8 weights a
    buffer apart from the 16-bit rest): Llama 3.1 405B on tp 8, pp 8 with 8 chunks a rank, cp 2, dp 8."""
    spec = get_preset("llama3.1-405b")
    layout = Layout(tp=8, sp=True, pp=8, schedule="interleaved", virtual_stages=8, cp=2, dp=8, zero=1,
                    overlap_grad_reduce=True, overlap_param_gather=True)
    first, *later = rank_kinds(layout, chunk_layers(layout, spec.n_layers, "megatron"), 1)
    for rank in later:
        assert gradient_buckets(spec, layout, rank, "megatron", True, 4)[0] == 8
        assert gradient_buckets(spec, layout, rank, "megatron", True, 4, fp8_params=True)[0] == 16
    weights, rest = megatron_tensors(spec, layout, replace(first, layers=first.chunk_layers[0], last=False, chunks=()))
    bucketed = len(greedy_buckets(list(reversed(weights + rest)), (40_000_000,)))
    assert gradient_buckets(spec, layout, first, "megatron", True, 4)[0] == bucketed + 7
    assert gradient_buckets(spec, layout, first, "megatron", False, 4)[0] == 8  # without overlap: a chunk each
