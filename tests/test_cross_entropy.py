"""The loss's memory per stack, against the stacks' own cross-entropy code run on the CPU.

The reference decoder's loss (``F.cross_entropy`` on an fp32 copy of the
logits, as torchtitan and transformers compute it without tensor parallelism),
Megatron's ``vocab_parallel_cross_entropy`` from megatron-core itself and
torchtitan's ``_LossParallelCrossEntropy``, on a tensor-parallel group of one
(gloo). Two instruments: autograd's
saved-tensor hooks for what the loss keeps, and a dispatch-mode counter of
live storages for the two moments the ledger adds on top of what is kept (the
forward's last and the loss's backward).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from tests.live_bytes import LiveBytes  # noqa: E402

SPEC = get_preset("bench-llama-tiny")  # vocabulary 512, hidden 64
SEQ, MICRO = 64, 2
TOKENS = SEQ * MICRO
DTYPES = {"bf16-pure": torch.bfloat16, "fp32": torch.float32}
LOSS_NAMES = ("log_softmax", "targets")


@pytest.fixture(scope="module")
def tensor_parallel_group(tmp_path_factory):
    """A gloo group of this one process: the tensor-parallel group the stacks' vocabulary-parallel losses reduce over."""
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def megatron_cross_entropy(tensor_parallel_group):
    """megatron-core's vocab_parallel_cross_entropy, its model-parallel state made over that group."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core warns that Transformer Engine and Apex are absent
        parallel_state = pytest.importorskip("megatron.core.parallel_state")
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    parallel_state.initialize_model_parallel(1)
    try:
        yield vocab_parallel_cross_entropy
    finally:
        parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module")
def torchtitan_cross_entropy(tensor_parallel_group):
    """torchtitan's _LossParallelCrossEntropy as its cross_entropy_loss calls it on a rank's vocabulary shard."""
    loss = pytest.importorskip("torchtitan.components.loss")
    return lambda logits, targets: loss._LossParallelCrossEntropy.apply(
        logits.float(), targets, tensor_parallel_group, logits.shape[-1], "sum")


TP = {"reference": 1, "megatron": 1, "torchtitan": 2}
"""torchtitan computes its own loss only under tensor parallelism: its ledger is a tp 2 rank's, whose vocabulary
shard the one-process group's function is given (the collectives allocate nothing over the vocabulary)."""
PER_TOKEN = {"reference": 0, "megatron": 24, "torchtitan": 64}
"""Bytes a token of temporaries the ledger leaves out (row maxima, shifted targets, aranges, predicted logits):
megatron 20 and torchtitan 33 to 50 here. A term over the vocabulary (here 512 bytes a token and more) cannot hide
under them."""


def _loss_function(stack: str, request):
    """The stack's loss of the head's output ``(tokens, vocab)``, as its training code computes it."""
    if stack == "reference":
        return lambda logits, targets, mask: F.cross_entropy(logits.float(), targets)
    if stack == "torchtitan":
        ce = request.getfixturevalue("torchtitan_cross_entropy")
        return lambda logits, targets, mask: ce(logits, targets)
    ce = request.getfixturevalue("megatron_cross_entropy")

    def megatron(logits, targets, mask):
        # megatron/core/models/common/language_module: logits and labels are [s, b, ...] ...
        losses = ce(logits.view(SEQ, MICRO, -1), targets.view(SEQ, MICRO))
        # ... and pretrain_gpt.py's loss_func sums the losses under the fp32 loss mask.
        return torch.sum(losses.view(-1).float() * mask.view(-1).float())

    return megatron


def _head(stack: str, dtype):
    torch.manual_seed(0)
    vocab = SPEC.vocab_size // TP[stack]
    hidden = torch.randn(TOKENS, SPEC.hidden, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, SPEC.hidden, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (TOKENS,))
    return hidden, weight, targets, torch.ones(TOKENS)


def _ledger(stack: str, precision: str):
    config = TrainConfig(seq_len=SEQ, micro_batch=MICRO, precision=precision, stack=stack,
                         layout=Layout(tp=TP[stack]))
    return activation_ledger(SPEC, config, "cpu")


@pytest.fixture(params=list(TP))
def stack(request):
    return request.param


@pytest.mark.parametrize("precision", DTYPES)
def test_the_loss_keeps_what_the_stacks_cross_entropy_saves(stack, precision, request):
    loss_function = _loss_function(stack, request)
    hidden, weight, targets, mask = _head(stack, DTYPES[precision])
    logits = F.linear(hidden, weight)
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_function(logits, targets, mask)
    predicted = [t for t in _ledger(stack, precision).traced if t.name.startswith("loss.") or t.name in LOSS_NAMES]
    assert sorted(saved.values()) == sorted(t.bytes for t in predicted), [(t.name, t.bytes) for t in predicted]
    assert max(saved.values()) == TOKENS * weight.shape[0] * 4  # fp32 over the vocabulary, in every stack


@pytest.mark.parametrize("precision", DTYPES)
def test_the_moments_beyond_what_is_kept_are_the_ledgers(stack, precision, request):
    """The forward's last moment (the head's output and what the loss makes of it) and the loss's backward.

    Reference: two fp32 tensors over the vocabulary beside the 16-bit logits in forward, two in backward, exactly.
    Megatron's fp32 copy is what it keeps and its backward writes the gradient into it: only the 16-bit logits and
    their 16-bit gradient are added. torchtitan's loss-parallel function holds one fp32 tensor more than the
    reference in each. The ledger leaves out per-token temporaries (``PER_TOKEN``); at Megatron's backward moment
    the seed gradient of its summed loss, one fp32 scalar, is alive too.
    """
    loss_function = _loss_function(stack, request)
    hidden, weight, targets, mask = _head(stack, DTYPES[precision])
    with LiveBytes(hidden, weight, targets, mask) as live:
        live.mark()
        loss = loss_function(F.linear(hidden, weight), targets, mask)
        forward_peak = live.peak
        kept = live.mark()
        loss.backward()
        backward = live.peak - kept
    forward = forward_peak - kept
    ledger = _ledger(stack, precision)
    over_vocab = TOKENS * weight.shape[0]
    head_output = 2 * over_vocab if precision != "fp32" else 0
    fp32_tensors = {"reference": (1, 2), "megatron": (0, 0), "torchtitan": (2, 3)}[stack]
    assert ledger.forward_transient_bytes == fp32_tensors[0] * 4 * over_vocab + head_output
    assert 0 <= forward - ledger.forward_transient_bytes <= PER_TOKEN[stack] * TOKENS, forward
    if stack == "megatron":
        assert ledger.loss_gradient_bytes == head_output
        if precision != "fp32":  # in fp32 the head's own backward (its input's and weight's gradients) is the moment
            assert backward == ledger.loss_gradient_bytes + 4
        return
    assert ledger.loss_gradient_bytes == fp32_tensors[1] * 4 * over_vocab
    assert 0 <= backward - ledger.loss_gradient_bytes <= PER_TOKEN[stack] * TOKENS, backward


def test_megatrons_loss_is_the_reference_less_its_fp32_copies():
    """At llama3-8b's size (vocabulary 128,256, s = 8192, bf16): the same probabilities kept, but the forward's fp32
    copy and the backward's two fp32 gradients are gone."""
    spec = get_preset("llama3-8b")
    config = TrainConfig(seq_len=8192, precision="bf16-pure")
    reference = activation_ledger(spec, config, "cuda")
    megatron = activation_ledger(spec, TrainConfig(seq_len=8192, precision="bf16-pure", stack="megatron"), "cuda")
    over_vocab = 8192 * 128_256
    assert reference.forward_transient_bytes - megatron.forward_transient_bytes == 4 * over_vocab
    assert reference.loss_gradient_bytes - megatron.loss_gradient_bytes == 6 * over_vocab
    probabilities = [t.bytes for t in megatron.traced if t.name == "loss.softmax"]
    assert probabilities == [t.bytes for t in reference.traced if t.name == "log_softmax"] == [4 * over_vocab]
