"""transformers' own tensor parallelism on two gloo ranks, against the analytic core of ``--stack hf --tp 2``.

One launch of torch's launcher runs tests/distributed/hf_tensor_parallel.py: each rank loads a small model of
transformers' with ``DistributedConfig(tp_size=2)`` and records what one forward keeps for backward, the
parameters it holds, its loss beside the whole model's, and the collectives torch's profiler saw in one
forward and one backward. Each is held here against the ledger, headroom.core.memory.static and headroom.core.timing.comm.
"""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import torch.distributed as dist  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch was built without torch.distributed or gloo", allow_module_level=True)

from headroom.agent.hf_trace import TracedLedger, differences  # noqa: E402
from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.memory.static import rank_parameters  # noqa: E402
from headroom.core.specs.hf_config import spec_from_hf_config  # noqa: E402
from headroom.core.specs.interconnect import cluster_for  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.timing.comm import step_communication  # noqa: E402
from tests.distributed.collectives import messages, other_all_reduces  # noqa: E402
from tests.distributed.hf_tensor_parallel import CASES  # noqa: E402
from tests.distributed.launch import launch  # noqa: E402
from tests.xdist_support import once_per_run  # noqa: E402

TP = 2
BY_NAME = {case.name: case for case in CASES}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Each rank's record (about 15 s on 2 cores: transformers imported twice, four models loaded)."""
    return once_per_run(tmp_path_factory, "hf-tensor-parallel", lambda folder: launch(TP, ["hf-tp"], out_dir=folder))


def _measured(ranks: list[dict], name: str) -> list[dict]:
    return [record["hf_tensor_parallel"][name] for record in ranks]


def _traced(measured: dict) -> TracedLedger:
    return TracedLedger.from_dict(measured["ledger"], measured["ledger"]["n_layers"])


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_each_rank_keeps_what_the_hf_ledger_counts(ranks, name):
    """Tensor for tensor, layer by layer: the blocks' tensors split by tp with the norms and residual stream
    whole (no sequence parallelism), and the loss's fp32 log-probabilities over the whole vocabulary, which
    every rank computes from the gathered logits."""
    case = BY_NAME[name]
    spec = spec_from_hf_config(case.config, name)
    analytic = activation_ledger(spec, case.train(TP), device="cpu")
    for rank, measured in enumerate(_measured(ranks, name)):
        traced = _traced(measured)
        assert differences(traced, analytic) == [], f"rank {rank}"
        assert traced.saved_bytes == analytic.saved_bytes
    log_probs = [t for t in analytic.tensors if t.name == "log_softmax"]
    assert [t.shape for t in log_probs] == [(case.micro_batch * case.seq_len, spec.vocab_size)]


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_each_rank_holds_the_parameters_the_core_gives_it(ranks, name):
    """The embedding split by vocabulary, the head by its rows, the blocks' linears by tp, the norms whole; a
    tied head is the embedding's shard."""
    spec = spec_from_hf_config(BY_NAME[name].config, name)
    assert [m["parameters"] for m in _measured(ranks, name)] == [rank_parameters(spec, Layout(tp=TP))] * TP


def test_the_split_model_computes_the_whole_models_loss(ranks):
    """The measurement is of a model that trains: its loss is the unsplit model's (to bf16's rounding of sums
    split two ways; exactly in fp32 here) and every gradient is finite."""
    for case in CASES:
        tolerance = 1e-6 if case.precision == "fp32" else 1e-3
        for measured in _measured(ranks, case.name):
            assert measured["loss"] == pytest.approx(measured["loss_unsharded"], abs=tolerance), case.name
            assert measured["grads_finite"], case.name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_a_steps_collectives_are_the_tensor_parallel_communication_the_core_counts(ranks, name):
    """Per micro-batch: 2 all-reduces a block forward and 5 backward (q, k, v, gate and up each sum their input's
    gradient), one more forward per block recomputed (its closing all-reduce is not rerun), the embedding's
    and the head's, and the logits' all-gather. Beside them c10d runs only the q and k norms' gradient
    all-reduces (two per block, their weights' bytes), which the core does not count."""
    case = BY_NAME[name]
    spec = spec_from_hf_config(case.config, name)
    train = case.train(TP)
    predicted = Counter()
    for term in step_communication(spec, train, 1, cluster_for("cpu", TP)):
        assert term.axis == "tp"
        predicted[term.op, term.message_bytes] += term.calls
    for measured in _measured(ranks, name):
        assert messages(measured["collectives"], TP) == predicted
        assert other_all_reduces(measured["collectives"]) == (2 * spec.n_layers if spec.qk_norm else 0)
