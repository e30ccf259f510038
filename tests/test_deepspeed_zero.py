"""DeepSpeed's ZeRO-1 and ZeRO-2 (the hf stack's sharding stages 1 and 2): the core's collectives against DeepSpeed
on two gloo ranks, call for call (tests/distributed/deepspeed_zero.py: the agent's decoder, bf16, the HF Trainer's two
parameter groups, a step of three micro-batches).

DeepSpeed all-reduces the gradients whole (its ``use_multi_rank_bucket_allreduce``), a bucket of at most
``reduce_bucket_size`` elements a call, every micro-batch under ZeRO-2 and in the step's last backward under ZeRO-1;
in the optimizer's step it all-reduces the gradients' norm once a parameter group and an overflow flag, then
all-gathers each group's updated parameters in one call. headroom.core.timing.gradient_buckets cuts the buckets and
headroom.core.timing.comm prices the calls; here both are held against what DeepSpeed ran.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.memory.pipeline import first_rank
from headroom.core.memory.static import RankTensor, rank_tensor_kinds
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.stack import DEEPSPEED_BUCKET_ELEMENTS
from headroom.core.timing.comm import step_communication
from headroom.core.timing.gradient_buckets import deepspeed_buckets, deepspeed_order

DP = 2


def test_a_bucket_is_reduced_before_a_tensor_would_overfill_it():
    """DeepSpeed 0.19.8 on two gloo ranks, a stack of four linears (96 -> 80 -> 64 -> 64 -> 48, with biases) at a
    reduce_bucket_size of 6,000 elements, reduced these buckets: backwards under ZeRO-2, in parameter order at
    ZeRO-1's boundary without overlap_comm (one parameter group)."""
    forward = [96 * 80, 80, 80 * 64, 64, 64 * 64, 64, 64 * 48, 48]
    assert deepspeed_buckets(reversed(forward), 6000) == [3184, 4160, 5200, 7680]
    assert deepspeed_buckets(forward, 6000) == [7680, 5264, 4160, 3120]
    assert deepspeed_buckets([9000, 10], 6000) == [9000, 10]  # a tensor past the limit is a bucket of its own
    assert deepspeed_buckets([], 6000) == []


def test_without_hooks_the_optimizers_groups_come_in_turn():
    tensors = [RankTensor(100, True, True), RankTensor(8, False, False), RankTensor(50, True, True),
               RankTensor(9, False, True)]
    assert [t.elements for t in deepspeed_order(tensors, hooked=True)] == [9, 50, 8, 100]
    assert [t.elements for t in deepspeed_order(tensors, hooked=False)] == [100, 50, 8, 9]


def test_the_hf_stacks_zero_1_gathers_in_its_step():
    """DeepSpeed gathers the updated parameters inside the optimizer's step: --overlap-param-gather on is refused
    under the HF Trainer's stacks, off is what they do."""
    with pytest.raises(ConfigError, match="--overlap-param-gather on under --stack hf: its ZeRO-1 and 2 are DeepSpeed's"):
        TrainConfig(seq_len=64, stack="hf", layout=Layout(dp=4, zero=1, overlap_param_gather=True)).check_sharding()
    TrainConfig(seq_len=64, stack="hf", layout=Layout(dp=4, zero=2, overlap_param_gather=False)).check_sharding()


pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from tests.distributed.data_parallel import MICRO_BATCH, SEQ_LEN, SPEC
from tests.distributed.deepspeed_zero import CASES, MICRO_BATCHES
from tests.distributed.launch import launch
from tests.xdist_support import once_per_run

ELEMENT_BYTES = {"torch.bfloat16": 2, "torch.float32": 4, "torch.uint8": 1}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Each rank's record (about 30 s on 2 cores: DeepSpeed imported, its CPU comm op built once, five engines)."""
    return once_per_run(tmp_path_factory, "deepspeed-zero",
                        lambda folder: launch(DP, ["deepspeed"], out_dir=folder, timeout_s=600))


def _config(case: dict) -> TrainConfig:
    return TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision=case["precision"],
                       stack="hf", layout=Layout(dp=DP, zero=case["stage"], overlap_grad_reduce=case["overlap_comm"]))


def _tensors() -> list[RankTensor]:
    layout = Layout(dp=DP)
    return rank_tensor_kinds(SPEC, layout, first_rank(layout, SPEC.n_layers))


def test_the_ranks_tensors_are_the_decoders(ranks):
    shapes = ranks[0]["deepspeed_zero"]["parameters"]
    assert [(t.elements, t.matrix) for t in _tensors()] == [(math.prod(shape), len(shape) > 1) for shape in shapes]
    # the linears (q, k, v, o, gate, up, down, the head), as torch_autocast's comm dtype marks them
    assert [t.linear for t in _tensors()] == ranks[0]["deepspeed_zero"]["linear"]


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case["reduce_bucket_size"]])
def test_the_core_cuts_deepspeeds_buckets(ranks, name):
    """Bucket for bucket, each backward that reduces: every micro-batch's under ZeRO-2, the last's under ZeRO-1;
    backwards where hooks reduce (ZeRO-2, or overlap_comm), the optimizer's groups in turn otherwise."""
    case = CASES[name]
    hooked = case["stage"] == 2 or case["overlap_comm"]
    predicted = deepspeed_buckets((t.elements for t in deepspeed_order(_tensors(), hooked)), case["reduce_bucket_size"])
    assert len(predicted) > 5
    reducing = range(MICRO_BATCHES) if case["stage"] == 2 else [MICRO_BATCHES - 1]
    for record in ranks:
        calls = record["deepspeed_zero"][name]
        for micro in range(MICRO_BATCHES):
            measured = [n for phase, op, n, _ in calls if phase == f"backward {micro}"]
            assert measured == (predicted if micro in reducing else []), (name, micro)
            assert all(op == "all_reduce" for phase, op, _, _ in calls if phase == f"backward {micro}")


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if not case["reduce_bucket_size"]])
def test_the_core_prices_deepspeeds_step_call_for_call(ranks, name):
    """The step's data-parallel terms make DeepSpeed's calls and move its bytes, by op and by where they run (in a
    backward or in the optimizer's step), at DeepSpeed's default bucket size (SPEC's 203,840 gradients one bucket)."""
    case = CASES[name]
    config = _config(case)
    measured_calls: Counter = Counter()
    measured_bytes: Counter = Counter()
    for phase, op, n, dtype in ranks[0]["deepspeed_zero"][name]:
        where = "step" if phase == "step" else "backward"
        measured_calls[where, op] += 1
        measured_bytes[where, op] += n * ELEMENT_BYTES[dtype]
    predicted_calls: Counter = Counter()
    predicted_bytes: Counter = Counter()
    for term in step_communication(SPEC, config, MICRO_BATCHES, cluster_for("cpu", DP)):
        assert term.axis == "dp" and term.group_size == DP
        where = "step" if "optimizer's step" in term.note else "backward"
        predicted_calls[where, term.op] += term.calls
        predicted_bytes[where, term.op] += term.total_bytes
    assert len(deepspeed_buckets((t.elements for t in _tensors()), DEEPSPEED_BUCKET_ELEMENTS)) == 1
    assert measured_calls == predicted_calls
    # the gradients' all-reduces priced as their buckets' average call, rounded up: within a byte a call
    gradients = ("backward", "all_reduce")
    assert 0 <= predicted_bytes[gradients] - measured_bytes[gradients] < measured_calls[gradients] * 2
    assert {k: v for k, v in predicted_bytes.items() if k != gradients} == \
        {k: v for k, v in measured_bytes.items() if k != gradients}
    exposed = [t for t in step_communication(SPEC, config, MICRO_BATCHES, cluster_for("cpu", DP))
               if "optimizer's step" in t.note]
    assert exposed and not any(t.overlappable for t in exposed)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if not case["reduce_bucket_size"]])
def test_the_core_holds_deepspeeds_reduction_buffers(ranks, name):
    """DeepSpeed allocates its reduction buffers whole at each backward's start: reduce_bucket_size elements of
    the parameters' dtype a communication dtype, two under overlap_comm, whatever the model's size (SPEC's 203,840
    parameters take a buffer of 500,000,000)."""
    case = CASES[name]
    static = estimate(SPEC, _config(case), "cpu").static
    for record in ranks:
        (buffers,) = set(record["deepspeed_zero"]["buffer_bytes"][name])  # the same at every backward
        assert static.gradient_buckets == buffers
    dtypes = 2 if case["precision"] == "amp-bf16" else 1
    element = 4 if case["precision"] == "amp-bf16" else 2
    assert static.gradient_buckets == dtypes * (2 if case["overlap_comm"] else 1) * DEEPSPEED_BUCKET_ELEMENTS * element
