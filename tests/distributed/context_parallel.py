"""torch's ring attention on gloo ranks: the collectives one layer's attention runs, forward and backward, under
each of its two ways of exchanging keys and values (headroom.core.timing.comm, ``cp_comm``).

torch's context parallelism dispatches CUDA's SDPA kernels to its ring attention; on a CPU the same ring
(``_templated_ring_attention`` and its backward, torch.distributed.tensor.experimental._context_parallel) is
called with the CPU's flash-attention kernels. Its rotations are recorded as they are called: each all-gather
of the keys and values (``all_gather_single``) and each pass to the next rank (``permute_tensor``), with the
pass it ran in, its dtype and its local bytes. Causal, load-balanced (torch's default), bf16, the shapes of
bench-gpt-tiny's attention (4 heads of 16, as many key/value heads) over a sequence of 64 tokens per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from headroom.core.specs.presets import get_preset

SPEC = get_preset("bench-gpt-tiny")
MICRO_BATCH, LOCAL_SEQ = 1, 64
METHODS = {"all-gather": "allgather", "ring": "alltoall"}
"""headroom's cp_comm -> torch's rotate method (``set_rotate_method``)."""


def measure() -> dict[str, list[list]]:
    """{cp_comm: [[pass, op, dtype, local bytes], ...] in the order called} for one layer's attention."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    head_dim = SPEC.hidden // SPEC.n_heads
    shape = (MICRO_BATCH, SPEC.n_heads, LOCAL_SEQ, head_dim)
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def backward_op(query, key, value, out, logsumexp, is_causal, grad_out):
        return backward(grad_out, query, key, value, out, logsumexp, 0.0, is_causal)

    calls: list[list] = []
    phase = ["forward"]
    permute, gather = ring.ft_c.permute_tensor, ring.ft_c.all_gather_single

    def permuted(tensor, *args, **kwargs):
        calls.append([phase[0], "send_recv", str(tensor.dtype).removeprefix("torch."),
                      tensor.numel() * tensor.element_size()])
        return permute(tensor, *args, **kwargs)

    def gathered(tensor, *args, **kwargs):
        calls.append([phase[0], "all_gather", str(tensor.dtype).removeprefix("torch."),
                      tensor.numel() * tensor.element_size()])
        return gather(tensor, *args, **kwargs)

    result: dict[str, list[list]] = {}
    ring.ft_c.permute_tensor, ring.ft_c.all_gather_single = permuted, gathered
    try:
        for cp_comm, method in METHODS.items():
            ring.set_rotate_method(method)
            torch.manual_seed(dist.get_rank())
            q, k, v = (torch.randn(shape, dtype=torch.bfloat16) for _ in range(3))
            calls.clear()
            phase[0] = "forward"
            out, logsumexp, *_ = ring._templated_ring_attention(dist.group.WORLD, 2, forward, q, k, v, is_causal=True)
            phase[0] = "backward"
            ring._templated_ring_attention_backward(dist.group.WORLD, 2, backward_op, torch.randn_like(out), "grad_out",
                                                    q, k, v, out, logsumexp, is_causal=True)
            result[cp_comm] = [list(call) for call in calls]
    finally:
        ring.ft_c.permute_tensor, ring.ft_c.all_gather_single = permute, gather
        ring.set_rotate_method("allgather")  # torch's default
    return result
