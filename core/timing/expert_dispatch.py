"""How a mixture of experts' tokens reach the ranks of their experts across nodes: by an all-to-all, or by DeepEP's
hierarchical dispatch.

An all-to-all sends each of a token's k copies to its expert's rank: (n - k) / n of a rank's rows leave its node,
each through the rank's own NIC (headroom.core.timing.comm.group_link). DeepEP (github.com/deepseek-ai/DeepEP; the
flex dispatcher's ``deepep`` backend in Megatron-LM, ``moe_comm_backend="deepep"`` in torchtitan) sends a token to
each other node its experts are on once, over RDMA to the GPU of the same index there, which forwards it over NVLink
to the experts' GPUs of that node: DeepSeek-V3's report (arXiv 2412.19437, Sec. 3.2.2) describes the scheme, and
Megatron-LM's MoE guide (megatron/core/transformer/moe/README.md) says the DeepEP backend "removes redundant tokens
during cross-node communication, fuses intra/inter-node communication into single kernel". NVIDIA's HybridEP (the
``hybridep`` backend, DeepEP's hybrid-ep branch) is priced the same way: its guide names TMA, IBGDA and fewer SMs,
not another traffic pattern.

With balanced routing a token's k experts are k of the group's E chosen alike, E / N on each of the N nodes the
expert-parallel group spans: the other nodes it reaches number (N - 1)(1 - C(E - E/N, k) / C(E, k)) on average
(`remote_nodes`). Combine sends the same bytes back. One kernel moves the RDMA and the NVLink parts together, so a
call takes the slower of the two. What DeepEP's buffers hold is not in the ledger, as NCCL's are not.
"""

from __future__ import annotations

import math

from headroom.core.errors import ConfigError

HIERARCHICAL: tuple[str, ...] = ("deepep", "hybridep")
"""The dispatchers that send a token once to each other node it goes to."""


def remote_nodes(experts: int, k: int, nodes: int) -> float:
    """The other nodes one token's ``k`` experts are on, on average: ``experts`` spread evenly over ``nodes``, the k
    chosen alike without replacement (balanced routing), (N - 1)(1 - C(E - E/N, k) / C(E, k))."""
    for name, value in (("experts", experts), ("experts a token", k), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if experts % nodes or k > experts:
        raise ConfigError(f"{experts} experts do not spread evenly over {nodes} nodes with {k} a token")
    missed = math.comb(experts - experts // nodes, k) / math.comb(experts, k)  # a given other node gets none
    return (nodes - 1) * (1 - missed)
