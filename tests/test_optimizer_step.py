"""The optimizer's step against the core: what torch's optimizers allocate beyond their state, and the
step's whole peak, counted storage by storage on the CPU (tests/live_bytes.py). On CUDA the fused AdamW
step's peak is checked against an H200 in tests/test_reference_data.py."""

import pytest

torch = pytest.importorskip("torch")

from headroom.agent.bench_train import forward_loss, make_optimizer  # noqa: E402
from headroom.core.memory.estimate import estimate  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.precision import (  # noqa: E402
    OPTIMIZER_STATE_BYTES,
    optimizer_step_transient_bytes,
)
from headroom.core.specs.presets import get_preset  # noqa: E402
from tests.live_bytes import LiveBytes  # noqa: E402
from tests.probing import build  # noqa: E402

CPU = torch.device("cpu")


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]


def _step_bytes(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[int, int]:
    """(bytes alive before the step: parameters, gradients and state; the step's peak above them)."""
    with LiveBytes(*params, *(p.grad for p in params), *_state_tensors(optimizer)) as live:
        before = live.mark()
        optimizer.step()
    return before, live.peak - before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPTIMIZER_STATE_BYTES))
def test_the_step_allocates_what_the_core_says_beyond_the_state(name, dtype):
    """Four tensors of several sizes; the second step, once the state exists. AdaGrad on a CPU runs tensor
    by tensor, so the core's one copy of its state is a bound there."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, dtype=dtype)) for shape in ((300, 200), (200, 200), (500,), (7,))]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = make_optimizer(name, params, CPU)
    optimizer.step()
    state = sum(t.nbytes for t in _state_tensors(optimizer) if t.dim())  # Adam's step counters are scalars
    _, transient = _step_bytes(optimizer, params)
    predicted = optimizer_step_transient_bytes(name, "cpu", state)
    if name == "adagrad":
        assert 0 < transient <= predicted
    else:
        assert transient == predicted


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_a_decoder_steps_at_the_predicted_optimizer_peak(precision):
    """The agent's decoder after a forward and backward: at the optimizer's step the parameters, every
    gradient and AdamW's state are alive, and foreach's copy of the second moments. The core counts the
    state in fp32 and leaves out AdamW's step counters (one fp32 scalar per parameter tensor); bf16-pure
    under torch keeps the moments in bf16, half the core's figure (headroom.core.specs.precision)."""
    spec = get_preset("bench-llama-tiny")
    config = TrainConfig(seq_len=16, micro_batch=2, precision=precision, optimizer="adamw")
    model, tokens, targets = build(spec, config)
    params = list(model.parameters())
    optimizer = make_optimizer("adamw", params, CPU)
    for _ in range(2):  # the second step, when the state exists
        optimizer.zero_grad(set_to_none=True)
        forward_loss(model, tokens, targets, precision).backward()
        if optimizer.state:
            before, transient = _step_bytes(optimizer, params)
        else:
            optimizer.step()
    predicted = estimate(spec, config, "cpu")
    counters = 4 * len(params)
    state_scale = 2 if precision == "bf16-pure" else 1  # bf16 moments where the core counts fp32
    static = predicted.static
    assert before == (static.parameters + static.gradients + static.optimizer_states // state_scale + counters)
    assert transient == predicted.optimizer_transient_bytes // state_scale
    if precision == "fp32":
        assert before + transient == predicted.optimizer_peak_bytes + counters
