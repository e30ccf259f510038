"""CUDA-only checks of the agent's GPU paths (skipped without a GPU; benchmarks/gpu_check.py covers the rest)."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from headroom.agent.ledger_check import LedgerCase, check  # noqa: E402
from headroom.agent.timer import time_fn  # noqa: E402

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda:0")


def test_short_kernels_are_timed_as_cuda_graph_blocks():
    a, b = (torch.randn(512, 512, device=CUDA, dtype=torch.bfloat16) for _ in range(2))
    timing = time_fn(lambda i: a @ b, CUDA, budget_s=0.05, graph=True)
    assert timing.details()["cuda_graph"] is True and timing.calls_per_sample > 10
    assert 0 < timing.median_s < 1e-3


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_offload_books_host_weight_copies_as_weight_copies(precision):
    result = check(LedgerCase("bench-llama-tiny", 4, 64, 2, "flash", 0.0, "offload", precision), CUDA)
    assert result.status == "ok", result.diff
    assert result.parts["host"][1] > 0
