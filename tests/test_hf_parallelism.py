"""What the HF Trainer can split a model by, as the planner sees it (headroom.core.specs.stack): transformers' own tensor
parallelism without sequence parallelism, no pipeline, and the logits gathered onto every tensor-parallel rank.
tests/test_hf_tensor_parallel.py holds the same against two real ranks."""

from __future__ import annotations

from collections import Counter

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.ledger import activation_ledger
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.comm import step_communication

SPEC = get_preset("llama3-8b")


@pytest.mark.parametrize("stack", ["hf", "hf-liger"])
def test_a_pipeline_under_the_hf_trainer_is_refused_by_name(stack):
    with pytest.raises(ConfigError) as caught:
        activation_ledger(SPEC, TrainConfig(seq_len=4096, stack=stack, layout=Layout(pp=2)))
    assert str(caught.value) == (
        f"--stack {stack} --pp 2: the HF Trainer has no pipeline schedule (transformers' own pipeline only sends "
        "hidden states forward, for inference); use pp 1 with sharding (zero 3), or --stack torchtitan or megatron "
        "for a pipeline")


def test_sequence_parallelism_under_hf_is_refused_by_name():
    with pytest.raises(ConfigError) as caught:
        activation_ledger(SPEC, TrainConfig(seq_len=4096, stack="hf", layout=Layout(tp=2, sp=True)))
    assert str(caught.value) == (
        "--stack hf --sp on: transformers' tensor parallelism replicates the norms and the residual stream (its "
        "DistributedConfig's enable_sequence_parallel is not wired up); use --sp off")


def test_the_search_tries_hf_without_pipeline_or_sequence_parallelism():
    def axes(stack: str) -> set[tuple[int, int, bool]]:
        return {(layout.tp, layout.pp, layout.sp)
                for layout in candidate_layouts(SPEC, TrainConfig(seq_len=4096, stack=stack), 64, 16, 8, frozenset())}

    assert axes("hf") == {(tp, 1, False) for tp in (1, 2, 4, 8)}
    assert axes("hf-liger") == {(1, 1, False)}
    reference = axes("reference")
    assert {pp for _, pp, _ in reference} == {1, 2, 4, 8, 16}
    assert (2, 1, True) in reference and (2, 1, False) not in reference


def test_every_tensor_parallel_rank_under_hf_keeps_the_whole_vocabularys_log_probabilities():
    """The head's output is gathered: the loss's fp32 log-probabilities and the logits' transient copies are
    over all V on each rank, where torchtitan's loss-parallel keeps V / tp."""
    tokens, vocab = 4096, SPEC.vocab_size

    def ledger(stack: str):
        return activation_ledger(SPEC, TrainConfig(seq_len=tokens, stack=stack, precision="bf16-pure",
                                                   layout=Layout(tp=4)))

    hf = ledger("hf")
    assert [t.shape for t in hf.tensors if t.name == "log_softmax"] == [(tokens, vocab)]
    assert [t.shape for t in ledger("reference").tensors if t.name == "log_softmax"] == [(tokens, vocab // 4)]
    assert hf.forward_transient_bytes == tokens * vocab * (4 + 2)  # the fp32 copy and the gathered 16-bit logits
    assert hf.loss_gradient_bytes == 2 * tokens * vocab * 4


@pytest.mark.parametrize("policy", ["none", "full"])
def test_hf_tensor_parallel_communication_per_micro_batch(policy):
    """Per block 2 all-reduces forward and 5 backward, 1 more forward per block under full recompute (its
    closing one is not rerun); the embedding's and the head's; and one all-gather of the logits."""
    layers, b, s, h, e = SPEC.n_layers, 1, 4096, SPEC.hidden, 2
    train = TrainConfig(seq_len=s, stack="hf", precision="bf16-pure", recompute=parse_policy(policy),
                        layout=Layout(tp=4))
    terms: Counter = Counter()
    for t in step_communication(SPEC, train, 3, cluster_for("h100", 8)):
        terms[t.op, t.message_bytes] += t.calls
    per_block = 2 + 5 + (1 if policy == "full" else 0)
    assert terms == {("all_reduce", b * s * h * e): 3 * (layers * per_block + 2),
                     ("all_gather", b * s * SPEC.vocab_size * e): 3}
