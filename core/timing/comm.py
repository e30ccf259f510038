"""Communication of one training step: collective times, and the traffic a layout makes.

Collective time (nccl-tests conventions, doc/PERFORMANCE.md). A collective on
a message of S bytes over n ranks, each with B bytes/s to the outside world
in each direction (headroom.core.specs.interconnect), takes at best

    t = S x bus_factor(op, n) / B

with bus_factor all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n
(S the full gathered buffer / the full input, i.e. n x the per-rank shard),
all-to-all (n-1)/n, send/recv 1. We add a ring latency term, one
``link.latency_s`` per ring step: 2(n-1) steps for all-reduce (a
reduce-scatter pass then an all-gather pass), n-1 for all-gather and
reduce-scatter, 1 for send/recv and 1 for all-to-all (a send and a receive
per peer, all issued at once: collective_ops.ring_steps), and divide B
by an efficiency for protocol overhead. NVLink SHARP (NVLS) all-reduce, which
reduces inside the switch and beats the ring bound, is not modelled.

Placement. Ranks are numbered tp fastest, then cp, then dp, then pp
(Megatron's default order tp-cp-dp-pp). A group along one axis is ``size`` ranks
``stride`` apart, stride = product of the axes inside it. Expert parallelism
borrows ranks from dp x cp: an ``ep`` group is ep neighbouring ranks of the
dp x cp block (stride tp), and the ``edp`` group that shares its experts'
weights takes every ep-th rank of that block (torchtitan's sparse mesh,
``efsdp`` x ``ep`` with ``ep`` innermost). All
such groups stay inside a node when stride x size divides ``gpus_per_node``;
otherwise some group straddles nodes, the step waits for it, and it runs at the
slower of the node's link and the per-GPU NIC.

Step traffic: see `step_communication`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from headroom.core.errors import ConfigError
from headroom.core.memory.pipeline import RankKind, rank_kinds
from headroom.core.memory.static import (
    RankTensor,
    fsdp_sharding_units,
    fsdp_units,
    rank_expert_parameters,
    rank_parameters,
    rank_tensor_kinds,
    rank_tensors,
    te_rank_weights,
)
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.data_parallel import DataParallelSchedule
from headroom.core.specs.interconnect import Cluster, Link
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import DTYPE_BYTES, PrecisionRecipe
from headroom.core.specs.stack import DEEPSPEED_BUCKET_ELEMENTS, get_stack
from headroom.core.specs.stages import chunk_layers
from headroom.core.timing.collective_ops import (
    bus_factor,
    nics_worth,
    ring_latency_s,
    ring_steps,
)
from headroom.core.timing.expert_dispatch import HIERARCHICAL, remote_nodes
from headroom.core.timing.gradient_buckets import (
    deepspeed_buckets,
    deepspeed_order,
    gradient_buckets,
)

RANK_ORDER: tuple[str, ...] = ("tp", "cp", "dp", "pp")
"""Axes from fastest-varying rank index to slowest (Megatron's tp-cp-dp-pp)."""
GROUPS: tuple[str, ...] = (*RANK_ORDER, "dp-cp", "ep", "edp", "dp-cp-reshard", "edp-reshard")
"""Group axes; ``dp-cp`` is the gradient group: context-parallel ranks hold the same weights as data-parallel ones;
``ep`` the ranks that split the experts, ``edp`` the ranks that hold the same experts (dp x cp / ep);
``dp-cp-reshard`` and ``edp-reshard`` the k neighbouring ranks of those a shard is kept over between forward and
backward (Layout.reshard_after_forward = k)."""

MEASURED = "measured"
"""A term's ``link_key`` when its time comes from the box's measured collectives (Cluster.measured)."""

DEFAULT_COLLECTIVE_EFFICIENCY = 0.8
"""Fraction of link bandwidth NCCL reaches on large messages. Source: S. Jeaugey (NCCL),
NVIDIA/nccl-tests issue #212 (2024): "450GB/s is the line rate. With the protocol
overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" (busbw of
ring collectives on 8 x H100), 370/450 = 0.82. Applied to every link; for PCIe
and networks it is an assumption."""


def _count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return value


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def collective_seconds(
    op: str, message_bytes: int, group_size: int, link: Link,
    efficiency: float = DEFAULT_COLLECTIVE_EFFICIENCY, latency_s: float | None = None,
) -> float:
    """One collective: ring_steps x latency + S x bus_factor / (B x efficiency).

    ``message_bytes`` is nccl-tests' S (for all-gather the gathered buffer, for
    reduce-scatter the full input); ``link.bytes_per_s`` is B, per GPU per direction. ``latency_s``: the call's
    latency where it is not ring_steps x the link's (a group across nodes: `crossing_latency_s`).
    """
    _count("message bytes", message_bytes, minimum=0)
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ConfigError(f"collective efficiency must be in (0, 1], got {efficiency!r}")
    steps = ring_steps(op, group_size)
    if steps == 0:
        return 0.0
    latency = steps * link.latency_s if latency_s is None else latency_s
    return latency + message_bytes * bus_factor(op, group_size) / (link.bytes_per_s * efficiency)


# ---- placement ------------------------------------------------------------------


def _group(axis: str, layout: Layout) -> tuple[int, int]:
    """(stride, size) of the groups along an axis, ranks numbered tp-cp-dp-pp."""
    if axis not in GROUPS:
        raise ConfigError(f"unknown parallel axis {axis!r}; valid: {', '.join(GROUPS)}")
    if axis == "dp-cp":
        return layout.tp, layout.cp * layout.dp
    if axis == "ep":
        return layout.tp, layout.ep
    if axis == "edp":
        return layout.tp * layout.ep, layout.expert_data_parallel
    if axis.endswith("-reshard"):
        kept = layout.reshard_after_forward
        size = kept if isinstance(kept, int) and not isinstance(kept, bool) else 1
        return _group(axis.removesuffix("-reshard"), layout)[0], size
    stride = 1
    for inner in RANK_ORDER[: RANK_ORDER.index(axis)]:
        stride *= getattr(layout, inner)
    return stride, getattr(layout, axis)


def crosses_nodes(axis: str, layout: Layout, cluster: Cluster) -> bool:
    """Some group along ``axis`` spans more than one node (`nodes_spanned`): never where the whole run fits on
    one node, however large a node is."""
    return nodes_spanned(axis, layout, cluster) > 1


def members_per_node(axis: str, layout: Layout, cluster: Cluster) -> int:
    """Ranks of one group along ``axis`` on one node: a group of stride s holds every s-th GPU of a node. A group
    that straddles nodes unevenly (stride x size neither divides a node nor is divided by it: ep 12 on nodes of 8
    holds 8 and 4, or 4 and 8) counts the fewest it holds on any node it touches, over the groups: the most
    loaded crossing sets the step's pace."""
    stride, size = _group(axis, layout)
    return _placement(stride, size, cluster.gpus_per_node, layout.world)[0]


def nodes_spanned(axis: str, layout: Layout, cluster: Cluster) -> int:
    """The most nodes one group along ``axis`` touches (1 inside a node): its ring's hops between nodes."""
    stride, size = _group(axis, layout)
    return _placement(stride, size, cluster.gpus_per_node, layout.world)[1]


@functools.lru_cache(maxsize=4096)
def _placement(stride: int, size: int, gpus_per_node: int, world: int) -> tuple[int, int]:
    """(the fewest members a group holds on a node it touches, the most nodes it touches), over the groups of
    ``size`` ranks ``stride`` apart among ``world`` ranks (a multiple of stride x size) on nodes of
    ``gpus_per_node``, ranks numbered node by node: a run on one node, however large the node, has every group
    inside it."""
    g, span = gpus_per_node, stride * size
    even = max(1, min(size, g // stride))
    if g % span == 0 or world <= g:
        return even, 1
    if span % g == 0:
        return even, size // even
    fewest, most = even, 1
    for start in range(0, min(math.lcm(span, g), world, UNEVEN_RANKS_WALKED), span):  # repeats after lcm
        for first in range(start, start + stride):
            held: dict[int, int] = {}
            for rank in range(first, first + span, stride):
                held[rank // g] = held.get(rank // g, 0) + 1
            if len(held) > 1:
                fewest, most = min(fewest, *held.values()), max(most, len(held))
    return fewest, most


def crossing_latency_s(op: str, axis: str, layout: Layout, cluster: Cluster) -> float:
    """One call's latency over a group along ``axis`` across nodes (collective_ops.ring_latency_s): the hops
    between its nodes at the network's latency, the rest at the node link's, no less than the host's network
    post overhead (Cluster.spanning_hop_s)."""
    size = _group(axis, layout)[1]
    return ring_latency_s(op, size, nodes_spanned(axis, layout, cluster), cluster.spanning_hop_s,
                          cluster.inter.latency_s)


UNEVEN_RANKS_WALKED = 1 << 16
"""Ranks `members_per_node` walks to find the fewest members an unevenly straddling group holds on a node (its
placement repeats every lcm(stride x size, GPUs a node) ranks; past this many the fewest is already found)."""


def group_link(axis: str, layout: Layout, cluster: Cluster, op: str = "all_reduce") -> Link:
    """The link a group along ``axis`` runs ``op`` at: the node's link, or across nodes the slower of the
    node's link and the NICs the group's members on one node drive together. NCCL runs one ring (or tree) per
    NIC, rail by rail, and only a ring's node-crossing hop uses a NIC, so a group with k members a node moves
    its bus bytes at k NICs' bandwidth (eight GPUs a node with eight NDR NICs: 400 GB/s, the 400-450 GB/s bus
    bandwidth multi-node nccl-tests reach on H100 SXM with NDR, Saturn Cloud's cluster-validation guide), one
    member at its one NIC's. A network given as NICs x Gb/s a node (Cluster.nics_per_node) is shared by the
    node's GPUs: every group along an axis runs its collective at once, so a group with k of a node's g GPUs
    has k / g of the node's NICs (four NICs for eight GPUs: half a NIC a member). On a mesh (MI300X's Infinity
    Fabric) the node's link is the share the group's size reaches (Link.for_group).

    Point-to-point traffic is not a ring's: each rank's bytes for another node leave through its own NIC (its
    share of one). A send/recv (a pipeline's hop, ring attention's pass) across nodes runs at one member's NIC
    share however many members a node holds. An all-to-all over n ranks with k a node sends (n - k) / n of each
    rank's buffer off the node through that rank's NIC while the bus bytes count (n - 1) / n of it, so its bus
    bandwidth is the NIC share x (n - 1) / (n - k): NCCL runs all-to-all as a send and a receive per peer, and
    DeepSeek-V3's report (arXiv 2412.19437, Sec. 3.2.2) bounds cross-node all-to-all by the 50 GB/s of InfiniBand
    a GPU has, not by NVLink's 160."""
    size = _group(axis, layout)[1]
    intra = cluster.intra.for_group(op, size)
    if not crosses_nodes(axis, layout, cluster):
        return intra
    members = members_per_node(axis, layout, cluster)
    share = cluster.nics_per_node / cluster.gpus_per_node if cluster.nics_per_node else 1
    nics = share * nics_worth(op, size, members)
    why = {"send_recv": "one member's", "all_to_all": f"a member's x (n - 1) / (n - k), k = {members}"}.get(
        op, f"for {members} members a node")
    inter = cluster.inter if nics == 1 else replace(
        cluster.inter, name=f"{cluster.inter.name}, {nics:g} NICs' worth: {why}",
        bytes_per_s=cluster.inter.bytes_per_s * nics)
    return min((inter, intra), key=lambda link: link.bytes_per_s)


# ---- parameters held by one rank ----------------------------------------------------


def largest_rank_parameters(spec: ModelSpec, layout: Layout, stack: str = "reference") -> int:
    """Parameters of the most loaded rank kind before data-parallel sharding (headroom.core.memory.static.rank_parameters)."""
    return rank_parameters(spec, layout, largest_rank(spec, layout, stack))


def largest_rank(spec: ModelSpec, layout: Layout, stack: str = "reference") -> RankKind:
    """The rank kind holding the most parameters before data-parallel sharding (the first such), under the
    stack's split of the layers (headroom.core.specs.stages)."""
    kinds = rank_kinds(layout, chunk_layers(layout, spec.n_layers, stack), 1)
    return max(kinds, key=lambda rank: rank_parameters(spec, layout, rank))


def kept_unit_parameters(spec: ModelSpec, layout: Layout, rank: RankKind) -> int:
    """Parameters of the FSDP unit never resharded after forward: the final norm and head's, on the last stage
    (headroom.core.specs.data_parallel)."""
    return fsdp_units(spec, layout, rank)[-1][0] if rank.last else 0


# ---- traffic of one step ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CommTerm:
    """One kind of collective a rank runs during one optimizer step."""

    axis: str
    """Parallel axis: ``tp``, ``cp``, ``pp``, ``ep`` or ``dp`` (the gradient groups: dp x cp, and for the
    experts' weights under expert parallelism dp x cp / ep)."""
    op: str
    """Collective: one of collective_ops.PRICED_OPS."""
    message_bytes: int
    """nccl-tests S of one call, bytes."""
    calls: int
    """Calls per optimizer step."""
    group_size: int
    """Ranks in the group (2 or more)."""
    link_key: str
    """headroom.core.specs.interconnect key of the link it runs at, or ``measured`` (the box's measured curve)."""
    seconds: float
    """All calls of the step, seconds."""
    overlappable: bool
    """Can run while compute runs (see `exposed_seconds`)."""
    window: str
    """The compute an overlappable term hides behind, with its axis (`overlaps`): ``forward``, ``backward``
    or ``attention``; empty where it cannot overlap."""
    note: str
    """What moves and why, with its source."""

    @property
    def total_bytes(self) -> int:
        """message_bytes x calls."""
        return self.message_bytes * self.calls


def _tensor_parallel_calls(spec: ModelSpec, config: TrainConfig, layers: int,
                           bf16: int = 0) -> list[tuple[str, int, int, str]]:
    """Tensor parallelism's collectives in ``layers`` blocks for one micro-batch, as (op, bytes a token, calls,
    what): each call moves b s tokens (the whole gathered buffer under sp).

    A block's two row-parallel outputs are all-reduced forward, or under sp reduce-scattered with the norms'
    outputs that feed its column-parallel linears all-gathered. Backward, under sp each output's gradient is
    all-gathered; the input gradient of the column-parallel linears is reduced once per attention and MLP
    (reduce-scattered under sp), or, where each linear takes its input apart (Stack.splits_column_inputs),
    all-reduced whole once per linear. A recompute reruns the forward's, less each segment's closing reduction
    where it stops early and no dropout after it keeps a mask; op-selective reruns them block by block too, but
    for the reduce-scatters a stack's save list keeps (Stack.caches_reduce_scatters).

    Each moves its tensor's dtype: a matmul's output and its gradient the compute dtype; the norms' outputs
    and the residual stream's gradients the blocks' parameter dtype, fp32 under autocast, and the norms' outputs
    one byte under Transformer Engine's recipes, but in the ``bf16`` of the ``layers`` blocks kept out of the
    recipe (TrainConfig.first_last_bf16). Measured on two gloo ranks, reference and hf
    (tests/test_distributed_memory.py, tests/test_hf_tensor_parallel.py).
    """
    stack, policy = get_stack(config.stack), config.recompute
    matmul = spec.hidden * config.recipe.activation_bytes
    stream = spec.hidden * DTYPE_BYTES[config.block_param_dtype]
    reruns = layers if policy.caches_matmuls else config.recomputed_blocks(layers)
    rerun = 2 * reruns  # the forward's two per block
    segments = -(-reruns // (policy.segment_layers(layers) or 1)) if rerun else 0  # op-selective: block by block
    unclosed = segments if stack.early_stop and config.dropout == 0 else 0
    scatters_again = 0 if policy.caches_matmuls and stack.caches_reduce_scatters else rerun - unclosed
    columns = 3 + spec.mlp_projections - 1  # q, k, v and the MLP's up (and gate)
    backward = columns if stack.splits_column_inputs else 2
    again = "; again in the recompute" if rerun else ""
    closing = f"{again}, less its closing one per segment" if unclosed else again
    if not config.layout.sp:
        return [("all_reduce", matmul, 2 * layers + rerun - unclosed,
                 f"per block the 2 row-parallel outputs forward{closing}; Shoeybi 2019 Sec. 3"),
                ("all_reduce", stream, layers * backward,
                 f"per block {backward} column-parallel input gradients backward; Shoeybi 2019 Sec. 3")]
    sp = "Korthikanti 2022 Sec. 4.2.2"
    fp8 = " in fp8 (Transformer Engine)" if config.te_fp8 else ""
    # The norms' outputs gathered forward, and again in each block whose forward reruns (block-K's first K: the
    # first stage's bf16 end block among them).
    bf16_reruns = min(bf16, reruns)
    calls = [("all_gather", _norm_output_bytes(spec, config), 2 * (layers - bf16 + reruns - bf16_reruns),
              f"per block the 2 norms' outputs forward{fp8}{again}; {sp}")] if layers > bf16 else []
    if bf16:
        calls.append(("all_gather", stream, 2 * (bf16 + bf16_reruns),
                      f"the 2 norms' outputs of each of the {bf16} end blocks kept in bf16 forward{again}; {sp}"))
    calls += [("reduce_scatter", matmul, 2 * layers + scatters_again,
               f"per block the 2 row-parallel outputs forward{closing if scatters_again else ''}; {sp}"),
              ("all_gather", matmul, 2 * layers, f"per block the 2 row-parallel outputs' gradients backward; {sp}")]
    if stack.splits_column_inputs:
        calls.append(("all_reduce", stream, layers * columns,
                      f"per block the input gradient of each of its {columns} column-parallel linears, whole"))
    else:
        calls.append(("reduce_scatter", stream, 2 * layers, f"per block 2 column-parallel input gradients backward; {sp}"))
    return calls


def _regathered_calls(spec: ModelSpec, config: TrainConfig, layers: int,
                      bf16: int = 0) -> list[tuple[str, int, int, str]]:
    """Under sequence parallelism a stack that keeps a column-parallel linear's sharded input
    (``Stack.sp_keeps_gathered_input`` off: Megatron-LM) gathers it again in backward for the weight gradient, two a
    block, as (op, bytes a token, calls, what). Megatron-LM launches the all-gather asynchronously and runs the
    input-gradient GEMM beside it (``LinearWithGradAccumulationAndAsyncCommunication.backward``,
    megatron/core/tensor_parallel/layers.py; Korthikanti et al. 2022, Sec. 4.2.2: "overlapped"); Transformer
    Engine's linears gather it too, in fp8 under its recipes (headroom.core.specs.float8). Priced hidden behind the
    blocks' GEMMs."""
    if not config.layout.sp or get_stack(config.stack).sp_keeps_gathered_input:
        return []
    calls = [("all_gather", _norm_output_bytes(spec, config), 2 * (layers - bf16), "per block the 2 sharded norm "
              f"outputs again in backward, for the weight gradients{' (in fp8)' if config.te_fp8 else ''}, beside the "
              "input-gradient GEMMs; Korthikanti 2022 Sec. 4.2.2")] if layers > bf16 else []
    if bf16:
        calls.append(("all_gather", spec.hidden * DTYPE_BYTES[config.block_param_dtype], 2 * bf16,
                      f"the same for the {bf16} end blocks kept in bf16"))
    return calls


def _largest_stage_bf16(spec: ModelSpec, config: TrainConfig) -> int:
    """Of the blocks of the largest pipeline stage (whose collectives a rank's terms count), those
    TrainConfig.first_last_bf16 keeps out of the FP8 recipe: none where a middle stage holds as many blocks as any,
    else the end stage's."""
    if not config.first_last_bf16:
        return 0
    stages = config.stage_layers(spec)
    most = max(stages)
    largest = [i for i, n in enumerate(stages) if n == most]
    i = next((i for i in largest if 0 < i < len(stages) - 1), largest[0])
    return config.bf16_blocks(most, i == 0, i == len(stages) - 1)


def _norm_output_bytes(spec: ModelSpec, config: TrainConfig) -> int:
    """Bytes a token of a norm's output moves when sequence parallelism gathers it: the blocks' parameter dtype, or
    one under Transformer Engine's recipes, which quantize it before the gather, with MXFP8's scale byte a block
    (headroom.core.specs.float8)."""
    if config.te_fp8:
        return spec.hidden + (spec.hidden // config.float8.block if config.float8.block else 0)
    return spec.hidden * DTYPE_BYTES[config.block_param_dtype]


AMAX_BYTES = 8
"""torchao reduces a float8 scale's amax in fp64 (``tensor_to_amax``), so a sharded tensor's amax all-reduce moves
eight bytes a value."""
TE_AMAX_BYTES = 4
"""Transformer Engine's amaxes are fp32 (``Float8CurrentScalingQuantizer``'s all-reduce, extensions/cast.cpp)."""


def _float8_amax_calls(spec: ModelSpec, config: TrainConfig, layers: int, tokens: int) -> list[tuple[str, int, int, str]]:
    """The all-reduces of ``layers`` blocks' float8 scales for one micro-batch over the tensor-parallel ranks, as
    (op, message bytes, calls, what): a cast whose amax reduces over a sharded dimension all-reduces it (DTensor,
    in fp64). Tensorwise: one scalar for each cast of a sharded tensor: a column-parallel linear's weight forward,
    its output's gradient twice and its weight again backward; a row-parallel linear's input and weight forward and
    again backward. Rowwise: a row-parallel linear's input rows (``tokens`` values) and weight columns (hidden)
    forward; a column-parallel linear's output-gradient rows and weight rows (hidden) backward. A block whose
    forward reruns (full, every-K, op-selective) runs its forward's again, all of them: the casts come before
    the save that stops a recompute early. Counted call for call on two gloo ranks
    (tests/test_distributed_memory.py). Transformer Engine's current scaling all-reduces one fp32 amax for each
    sequence-parallel norm output it quantizes (``set_quantizer_amax_reduction_group`` over the tensor-parallel
    group, layernorm_linear.py); its delayed scaling reduces its amax histories once a forward, outside the
    tensor-parallel group (not priced: a few kilobytes a micro-batch)."""
    recipe = config.float8
    if recipe is None:
        return []
    policy = config.recompute
    reruns = layers if policy.caches_matmuls else config.recomputed_blocks(layers)
    again = f"; {reruns} blocks' forward again in the recompute" if reruns else ""
    if recipe.saves_fp8:
        if not recipe.reduces_amax or not config.layout.sp:
            return []
        note = ("Transformer Engine current scaling: per block the amax of the 2 sequence-parallel norm outputs "
                f"(q/k/v's and fc1's input){again}")
        return [("all_reduce", TE_AMAX_BYTES, 2 * (layers + reruns), note)]
    h, stack = spec.hidden, get_stack(config.stack)
    qkv = [(h, spec.q_dim + 2 * spec.kv_dim)] if stack.fused_qkv else [(h, spec.q_dim), (h, spec.kv_dim), (h, spec.kv_dim)]
    converts = recipe.converts
    columns = sum(converts(i, o) for i, o in qkv) \
        + (spec.mlp_projections - 1) * converts(h, spec.ffn_hidden)  # q, k, v (or one qkv) and up (and gate)
    rows = converts(spec.q_dim, h) + converts(spec.ffn_hidden, h)  # the attention's output and down
    if recipe.torchao_recipe == "tensorwise":
        forward, backward = columns + 2 * rows, 3 * columns + 2 * rows
        note = f"float8 tensorwise amaxes of sharded tensors: per block {forward} forward, {backward} backward"
        return [("all_reduce", AMAX_BYTES, layers * (forward + backward) + reruns * forward, note + again)]
    calls = (layers + reruns) * rows + layers * columns
    inputs = f"per block {rows} row-parallel inputs forward, {columns} column-parallel output gradients backward"
    weights = f"per block {rows} row-parallel forward, {columns} column-parallel backward"
    return [("all_reduce", AMAX_BYTES * tokens, calls, f"float8 rowwise amaxes over sharded rows: {inputs}{again}"),
            ("all_reduce", AMAX_BYTES * h, calls, f"float8 rowwise amaxes of sharded weights: {weights}{again}")]


def _context_parallel_calls(spec: ModelSpec, config: TrainConfig, layers: int) -> list[tuple[str, int, int, str, str]]:
    """Ring attention's collectives in ``layers`` blocks for one micro-batch, as (op, message bytes, calls, the
    window it overlaps with or "" where exposed, what). kv: this rank's K and V of one layer, b s/cp x kv_dim/tp x
    2 in the compute dtype; the attention runs again where the policy recomputes it (full, every-K, block-K's first K blocks,
    selective).

    torch's (headroom.core.specs.stack.Stack.context_parallel), counted call for call, with their sizes and dtypes,
    on gloo ranks (tests/distributed/context_parallel.py): ``all-gather`` gathers kv once in forward (nccl-tests
    S = cp kv), beside the first chunk's attention (the local one); ``ring`` passes it cp - 1 times, each beside
    a chunk. Backward does the same with kv again, and passes K's and V's gradients cp times in fp32
    (``convert_to_f32``), each beside a chunk but the last, which it waits for at once. Transformer Engine's
    (megatron): ``ring`` (``p2p``) passes kv cp - 1 times forward and K, V with dK, dV cp - 1 times backward,
    beside the chunks; ``all-gather`` gathers K and V forward and again backward and reduce-scatters dK and dV,
    exposed (its docstring: "KV all-gather between CP ranks is exposed")."""
    layout, policy = config.layout, config.recompute
    cp = layout.cp
    kv = config.micro_batch * _ceil(config.seq_len, cp) * _ceil(spec.kv_dim, layout.tp) * 2
    kv_bytes = kv * config.recipe.activation_bytes
    runs = layers + (layers if policy.recomputes_attention else config.recomputed_blocks(layers))
    again = " (+recompute)" if runs > layers else ""
    if get_stack(config.stack).context_parallel == "transformer-engine":
        if config.cp_comm == "ring":
            return [("send_recv", kv_bytes, runs * (cp - 1), "attention",
                     f"ring attention forward: local K and V, cp-1 hops per layer{again}"),
                    ("send_recv", 2 * kv_bytes, layers * (cp - 1), "attention",
                     "ring attention backward: K, V with dK, dV, cp-1 hops per layer")]
        half = cp * kv_bytes // 2
        return [("all_gather", half, 2 * runs, "", f"K and V gathered per layer forward{again}"),
                ("all_gather", half, 2 * layers, "", "K and V gathered again per layer backward"),
                ("reduce_scatter", half, 2 * layers, "", "dK and dV reduce-scattered per layer backward")]
    gradients = [("send_recv", kv * 4, layers * (cp - 1), "attention",
                  "dK and dV passed on per layer backward, fp32, cp-1 of cp hops beside a chunk"),
                 ("send_recv", kv * 4, layers, "", "dK and dV passed on per layer backward, fp32, the last hop")]
    if config.cp_comm == "ring":
        return [("send_recv", kv_bytes, runs * (cp - 1), "attention",
                 f"K and V passed on per layer forward, cp-1 hops{again}"),
                ("send_recv", kv_bytes, layers * (cp - 1), "attention", "K and V passed on per layer backward"),
                *gradients]
    return [("all_gather", cp * kv_bytes, runs, "first chunk",
             f"K and V gathered per layer forward{again}"),
            ("all_gather", cp * kv_bytes, layers, "first chunk", "K and V gathered again per layer backward"),
            *gradients]


LOSS_ALL_REDUCES = 3
"""A cross-entropy over logits split by vocabulary all-reduces three fp32 values a token forward: the
logits' maximum, the target's logit and the sum of exponentials (Megatron-LM's
``tensor_parallel/cross_entropy.py``; torch's ``loss_parallel``, measured on two gloo ranks). Backward needs none."""


def _vocabulary_calls(spec: ModelSpec, config: TrainConfig) -> list[tuple[str, int, int, str]]:
    """The collectives of the vocabulary's tensor-parallel layers for one micro-batch, as (op, bytes a token,
    calls, what).

    The embedding's rows are split: each rank looks up its slice of the vocabulary and the partial rows are
    all-reduced forward (under sp reduce-scattered along the sequence, their gradient all-gathered back). The
    head's columns are split: its input gradient is all-reduced backward (under sp its input is all-gathered
    forward and the gradient reduce-scattered). All of them move the residual stream's dtype (the blocks'
    parameter dtype). The loss over logits split by vocabulary takes ``LOSS_ALL_REDUCES`` all-reduces of 4
    bytes a token; a stack that gathers the logits (hf) all-gathers them instead, V values a token in the
    compute dtype. Under a pipeline the embedding is the first stage's and the head and loss the last's: the
    last stage's are counted, as headroom.core.timing.step counts the head on every rank. Measured on two gloo ranks, the
    agent's decoder (headroom.agent.parallel.parallelize_decoder) and transformers' (tests/test_distributed_memory.py,
    tests/test_hf_tensor_parallel.py).
    """
    stream = spec.hidden * DTYPE_BYTES[config.block_param_dtype]
    embedding = config.layout.pp == 1
    calls: list[tuple[str, int, int, str]] = []
    if config.layout.sp:
        if embedding:
            calls += [("reduce_scatter", stream, 1, "the embedding's partial rows, forward"),
                      ("all_gather", stream, 1, "the embedding's output gradient, backward")]
        calls += [("all_gather", stream, 1, "the head's input, forward"),
                  ("reduce_scatter", stream, 1, "the head's input gradient, backward")]
    else:
        calls.append(("all_reduce", stream, 2 if embedding else 1,
                      ("the embedding's partial rows forward and " if embedding else "")
                      + "the head's input gradient backward"))
    if get_stack(config.stack).gathers_logits:
        calls.append(("all_gather", spec.vocab_size * config.recipe.activation_bytes, 1,
                      "the head's output gathered for the loss over the whole vocabulary (transformers' "
                      "colwise_gather_output)"))
    else:
        calls.append(("all_reduce", 4, LOSS_ALL_REDUCES,
                      "the loss over the vocabulary's slices: each token's maximum logit, target logit and sum "
                      "of exponentials, fp32"))
    return calls


def step_communication(
    spec: ModelSpec, config: TrainConfig, accumulation_steps: int, cluster: Cluster,
    efficiency: float = DEFAULT_COLLECTIVE_EFFICIENCY,
) -> tuple[CommTerm, ...]:
    """Collectives of ONE rank in one optimizer step of m = ``accumulation_steps`` micro-batches.

    b micro-batch, s = seq_len/cp, h hidden, e activation bytes (the compute dtype),
    r the residual stream's element bytes (the blocks' parameter dtype: 4 under
    autocast, where FSDP does not gather 16-bit parameters), L' the most blocks a
    pipeline stage holds (headroom.core.specs.stages), v virtual stages:

    - tp: per layer and micro-batch 2 all-reduces of b s h forward, 2 backward
      (Shoeybi et al. 2019, Sec. 3), or one per column-parallel linear where each
      takes its input apart (``reference``, ``hf``: q, k, v, gate, up); full or every-K
      recompute runs the forward's 2 again, less one per segment where the
      recompute stops early (a segment's closing all-reduce feeds nothing saved),
      and so does op-selective, each block a segment (it saves matmul outputs,
      not collectives; torchtitan's list keeps the reduce-scatters);
      with sp 4 all-gathers + 4 reduce-scatters of the same S instead, the same
      bus bytes (Korthikanti et al. 2022, Sec. 4.2.2), or where each linear takes
      its input apart 4 all-gathers, 2 reduce-scatters and its per-linear
      all-reduces (`_tensor_parallel_calls`). A row-parallel output and its
      gradient move e bytes a value; a norm's output and a column-parallel input's
      gradient, r. The vocabulary's layers add per micro-batch the embedding's
      reduction (first stage) and the head's input gradient's, each b s h r
      (under sp a reduce-scatter and an all-gather each), and the loss's 3 fp32
      all-reduces of b s x 4 bytes over the vocabulary's slices, or, where the
      stack gathers the head's output (``hf``), one all-gather of b s V e
      (`_vocabulary_calls`). Not overlapped. Counted call for call, with each
      call's dtype, by torch's profiler on two gloo ranks, the agent's decoder and
      transformers' (tests/test_distributed_memory.py,
      tests/test_hf_tensor_parallel.py). Float8 linears add the all-reduces of their
      scales' amaxes over sharded dimensions, a few bytes each (`_float8_amax_calls`).
      Not counted: Megatron's extra all-gather of
      each column-parallel input in backward under sp (overlapped with the weight
      gradient). With ``Layout.tp_overlap`` (Megatron-LM's ``--tp-comm-overlap``:
      Transformer Engine splits each all-gather and reduce-scatter of a block's
      linears into tp pieces, each exchanged while the GEMM works on the one before;
      torchtitan's async tensor parallelism: inductor's micro-pipelined
      all-gather-matmul and matmul-reduce-scatter; Wang et al. 2023, "Overlap
      Communication with Dependent Computation via Decomposition", ASPLOS) each of
      the blocks' terms is two: its first 1/tp piece, exposed, and the rest, which
      overlaps with the blocks' GEMMs (window ``matmuls``); the embedding's, head's
      and loss's do not overlap.
    - cp: ring attention's exchange of keys and values, by the stack's implementation
      and the ring or all-gather variant (`_context_parallel_calls`), beside the
      attention's chunks where it can be.
    - pp: per micro-batch a rank sends v activations forward and v gradients back,
      b s h r each (the residual stream: fp32 out of an fp32 model's stage under
      autocast, as the agent's pipeline stage returns it), divided by tp under sp (megatron-core's p2p tensor shape; the
      scatter-gather of Narayanan et al. 2021 Sec. 4.1 is not modelled). Not overlapped.
    - dp: over the dp x cp ranks that share weights, P = largest_rank_parameters:
      zero 0 an all-reduce of P x grad_bytes once per step or every micro-batch
      (headroom.core.specs.data_parallel: the stack's loop, or the layout's
      setting), in DDP's or Megatron-LM's buckets, a call each
      (headroom.core.timing.gradient_buckets), or under torchtitan a call a FSDP
      unit; zero 1 one reduce-scatter of the
      gradients and one all-gather of P x param_bytes per step (Megatron-LM's
      bucket by bucket), or where ZeRO-1 is DDP under torch's
      ZeroRedundancyOptimizer (the reference stack) zero 0's all-reduce and a
      broadcast of each updated parameter tensor in the step, exposed; zero 2 the same but
      the gradient reduce-scatter runs every micro-batch (only a shard of the
      gradient is kept); zero 3 (FSDP) an all-gather of P x e forward per micro-batch
      (once per step where units stay gathered) and again backward for the units
      resharded after forward (over k ranks for a shard kept over k) (FSDP MixedPrecisionPolicy.param_dtype = compute dtype) and a
      reduce-scatter of P x grad_bytes (the sharded gradient's dtype: fp32 under
      amp-bf16, torchtitan's default reduce dtype; FSDP2 with reduce_dtype=None
      would reduce in bf16), each one call a unit (`_unit_calls`: FSDP2's foreach_all_gather and foreach_reduce,
      checked call for call on gloo ranks, tests/test_fsdp_schedule.py). Overlapped. Not counted: the
      tied-embedding gradient
      all-reduce between first and last pipeline stage. Under expert parallelism the
      rank's routed experts (headroom.core.memory.static.rank_expert_parameters) take the same
      collectives over the dp x cp / ep ranks holding the same experts, the rest
      over dp x cp.
    - ep: per mixture-of-experts layer and micro-batch an all-to-all dispatches each
      token's k copies to its experts' ranks and one combines their outputs, forward
      (again under block recompute) and backward: 2 (f + 1) all-to-alls of the
      rank's routed rows, S = b s k h dropless (at a capacity factor, E x capacity
      rows instead: ModelSpec.expert_rows) values of the residual stream's dtype (the
      blocks' parameter dtype: torchtitan's experts cast their output back to their
      input's, so under autocast both directions move fp32). With balanced routing a
      rank receives as many rows as it sends; nccl-tests' all-to-all S is the whole
      send buffer, (ep-1)/ep of which leaves the rank. Measured on two gloo ranks
      (tests/distributed/expert_parallel.py). torchtitan's and Megatron's all-to-all token dispatchers
      (``AllToAllTokenDispatcher`` in torchtitan/models/common/token_dispatcher.py,
      ``MoEAlltoAllTokenDispatcher`` in megatron/core/transformer/moe/token_dispatcher.py).
      Not overlapped, unless ``Layout.ep_overlap`` (Megatron-LM's combined 1F1B,
      headroom.core.specs.stack's ``overlaps_expert_parallel``): then the first
      micro-batch's forward all-to-alls and the last one's backward ones are
      exposed, and the rest run beside the compute of the micro-batch paired with
      theirs (window ``other micro-batch``: the other m - 1 forwards and
      backwards). DeepSeek-V3's DualPipe is not modelled.
    """
    m = _count("accumulation-steps", accumulation_steps)
    layout, recipe = config.layout, config.recipe
    b, h = config.micro_batch, spec.hidden
    s = _ceil(config.seq_len, layout.cp)
    layers = max(config.stage_layers(spec))
    terms: list[CommTerm] = []

    def add(axis: str, op: str, message: int, calls: int, size: int, overlappable: bool, note: str,
            group: str | None = None, window: str = "") -> None:
        group = group or ("dp-cp" if axis == "dp" else axis)
        link = group_link(group, layout, cluster, op)
        measured = _measured_seconds(op, message, size, group, layout, cluster, efficiency)
        latency = crossing_latency_s(op, group, layout, cluster) if crosses_nodes(group, layout, cluster) else None
        per_call = measured if measured is not None else collective_seconds(op, message, size, link, efficiency,
                                                                             latency)
        terms.append(CommTerm(axis=axis, op=op, message_bytes=message, calls=calls, group_size=size,
                              link_key=MEASURED if measured is not None else link.key, seconds=calls * per_call,
                              overlappable=overlappable, window=window if overlappable else "", note=note))

    if layout.tp > 1:
        bf16 = _largest_stage_bf16(spec, config)
        for op, token_bytes, calls, note in _tensor_parallel_calls(spec, config, layers, bf16):
            message = b * s * token_bytes
            if not layout.tp_overlap:
                add("tp", op, message, m * calls, layout.tp, False, note)
                continue
            # In tp pieces, each moved beside the GEMM of the one before: the first has nothing to hide behind.
            first = _ceil(message, layout.tp)
            add("tp", op, message - first, m * calls, layout.tp, True,
                f"{note}; {layout.tp - 1} of its {layout.tp} pieces beside the GEMMs", window="matmuls")
            add("tp", op, first, m * calls, layout.tp, False, f"{note}; the first of its {layout.tp} pieces")
        for op, token_bytes, calls, note in _regathered_calls(spec, config, layers, bf16):
            add("tp", op, b * s * token_bytes, m * calls, layout.tp, True, note, window="matmuls")
        for op, token_bytes, calls, note in _vocabulary_calls(spec, config):
            add("tp", op, b * s * token_bytes, m * calls, layout.tp, False, note)
        for op, message, calls, note in _float8_amax_calls(spec, config, layers - bf16, b * s):
            add("tp", op, message, m * calls, layout.tp, False, note)
    if layout.cp > 1:
        for op, message, calls, window, note in _context_parallel_calls(spec, config, layers):
            add("cp", op, message, m * calls, layout.cp, bool(window), note, window=window)
    if layout.pp > 1:
        activation = _ceil(b * s * h * DTYPE_BYTES[config.block_param_dtype], layout.tp if layout.sp else 1)
        add("pp", "send_recv", activation, 2 * m * layout.virtual_stages, layout.pp, False,
            "activation forward and gradient backward per micro-batch and virtual stage")
    if layout.ep > 1:
        routed = spec.expert_rows(b * s) * h * DTYPE_BYTES[config.block_param_dtype]
        reruns = config.recomputed_blocks(spec.moe_layers)
        again = f" (+2 in the recomputed forward of {reruns})" if reruns else ""
        calls = 2 * (2 * spec.moe_layers + reruns)
        what = f"token dispatch and combine: 2 per expert layer forward, 2 backward{again}"
        dispatch = None
        if config.ep_comm in HIERARCHICAL and crosses_nodes("ep", layout, cluster):
            dispatch = _hierarchical_dispatch(spec, config, cluster, b * s, routed, efficiency)
            if dispatch is None:
                what += (f"; {config.ep_comm} over a group that straddles nodes unevenly priced as an all-to-all "
                         "(DeepEP's peers are whole nodes)")

        def exchange(n: int, overlappable: bool, note: str, window: str = "") -> None:
            if dispatch is None:
                add("ep", "all_to_all", routed, n, layout.ep, overlappable, f"{what}{note}", window=window)
                return
            message, link_key, per_call, how = dispatch
            terms.append(CommTerm(axis="ep", op="all_to_all", message_bytes=message, calls=n, group_size=layout.ep,
                                  link_key=link_key, seconds=n * per_call, overlappable=overlappable,
                                  window=window if overlappable else "", note=f"{what}{note}; {how}"))

        if not layout.ep_overlap:
            exchange(m * calls, False, "")
        else:  # combined 1F1B: the first forward and the last backward run alone
            exchange(calls, False, "; the first micro-batch's forward and the last's backward, alone")
            if m > 1:
                exchange((m - 1) * calls, True, "; each beside another micro-batch's backward or forward",
                         window="other micro-batch")
    experts = rank_expert_parameters(spec, layout) if layout.ep > 1 else 0
    largest = largest_rank(spec, layout, config.stack)
    kept = kept_unit_parameters(spec, layout, largest)
    schedule = config.data_parallel
    by_unit = layout.zero == 3 or (layout.zero == 0 and get_stack(config.stack).replicates_through_fsdp)
    units = dict(zip(("dp-cp", "edp"), fsdp_sharding_units(spec, layout, largest), strict=True)) if by_unit else {}
    for p, whole, ranks, group, what in (
            (rank_parameters(spec, layout, largest) - experts, kept, layout.dp * layout.cp, "dp-cp", "dp x cp"),
            (experts, 0, layout.expert_data_parallel, "edp", "dp x cp / ep")):
        if p == 0 or ranks == 1:
            continue
        over = f"over {what} = {ranks} ranks" + (" (the experts' weights)" if group == "edp" else "")
        if schedule.deepspeed and layout.zero in (1, 2):  # DeepSpeed's own calls: its buckets by dtype, its step's
            tensors = rank_tensor_kinds(spec, layout, largest, experts=group == "edp")
            for op, message, calls, window, note in _deepspeed_calls(tensors, layout.zero, m, schedule, ranks, recipe,
                                                                      norms=group == "dp-cp"):
                add("dp", op, message, calls, ranks, bool(window), f"{note} {over}", group, window)
            continue
        # MXFP8's parameters are gathered in bf16 (through the gradient buffer) and cast after: none in fp8.
        in_fp8 = te_rank_weights(spec, config, largest) \
            if config.fp8_params and not config.float8.block and group == "dp-cp" else 0
        buckets = gradient_buckets(spec, layout, largest, config.stack, schedule.overlap_grad_reduce,
                                   recipe.grad_bytes, experts=group == "edp", fp8_params=in_fp8 > 0)
        for call in _sharding_collectives(layout.zero, m, schedule, ranks, p, whole, recipe, in_fp8):
            op, message, calls, size, reshard_group, window, note = call
            regathered = op == "all_gather" and window == "backward"
            if op == "broadcast":  # ZeroRedundancyOptimizer's: a call a parameter tensor
                tensors = len(rank_tensors(spec, layout, largest, experts=group == "edp"))
                split = _bucket_calls(message, calls, tensors, "one a parameter tensor", "a call a tensor")
            elif buckets is not None:
                split = _bucket_calls(message, calls, *buckets)
            else:
                split = _unit_calls(message, calls, units.get(group) if not in_fp8 else None,
                                    whole > 0 and regathered)
            for part, n, which in split:
                add("dp", op, part, n, size, bool(window),
                    f"{note}{which} {over if size == ranks else f'over {size} of the {what} = {ranks} ranks'}",
                    f"{group}-reshard" if reshard_group else group, window)
    return tuple(terms)


def _hierarchical_dispatch(spec: ModelSpec, config: TrainConfig, cluster: Cluster, tokens: int, routed: int,
                           efficiency: float) -> tuple[int, str, float, str] | None:
    """One dispatch (or combine) by DeepEP or HybridEP over an expert-parallel group across nodes
    (headroom.core.timing.expert_dispatch): each of the rank's ``tokens`` sent once to each other node its experts
    are on, through the rank's NIC, while its ``routed`` bytes (the k copies) reach their GPUs over the node's
    NVLink, in one kernel: the slower of the two, each from the cluster's measured collectives where it has them.
    (The slower part's bytes, its link, seconds a call, what.) None where the group straddles nodes unevenly: DeepEP
    addresses a peer as a node and a GPU in it, over groups of whole nodes."""
    layout = config.layout
    stride, size = _group("ep", layout)
    if (stride * size) % cluster.gpus_per_node:
        return None
    members = members_per_node("ep", layout, cluster)
    nodes = nodes_spanned("ep", layout, cluster)
    reached = remote_nodes(spec.n_experts, spec.experts_per_token, nodes)
    rdma = round(tokens * reached * spec.hidden * DTYPE_BYTES[config.block_param_dtype])
    nic = group_link("ep", layout, cluster, "send_recv")
    measured_across = _measured_seconds("send_recv", rdma, size, "ep", layout, cluster, efficiency)
    across = measured_across if measured_across is not None else \
        collective_seconds("send_recv", rdma, 2, nic, efficiency)
    measured_inside = cluster.measured.seconds("all_to_all", routed, members) \
        if cluster.measured is not None and members > 1 else None
    inside = measured_inside if measured_inside is not None else collective_seconds(
        "all_to_all", routed, members, cluster.intra.for_group("all_to_all", members), efficiency) if members > 1 \
        else 0.0
    how = (f"{config.ep_comm}: each token once to each other node of its experts ({reached:.2f} of {nodes - 1} on "
           f"average), then over NVLink to its experts' GPUs of that node ({members} a node); ")
    if across >= inside:
        return rdma, MEASURED if measured_across is not None else nic.key, across, how + "the RDMA part the slower"
    link = MEASURED if measured_inside is not None else cluster.intra.key
    return routed, link, inside, how + "the NVLink part the slower (its all-to-all's bytes)"


def _measured_seconds(op: str, message: int, size: int, group: str, layout: Layout, cluster: Cluster,
                      efficiency: float) -> float | None:
    """One call's time from the cluster's measured collectives, None where they hold none for it: a group inside a
    node from the node's curves, one across nodes from the curves measured across nodes, no faster than the
    node's own link moves it."""
    if cluster.measured is None:
        return None
    if not crosses_nodes(group, layout, cluster):
        return cluster.measured.seconds(op, message, size)
    across = cluster.measured.across_nodes
    if across is None:
        return None
    seconds = across.seconds(op, message, size, members_per_node(group, layout, cluster),
                             nodes_spanned(group, layout, cluster), cluster.spanning_hop_s, cluster.inter.latency_s)
    if seconds is None:
        return None
    return max(seconds, collective_seconds(op, message, size, cluster.intra.for_group(op, size), efficiency))


def _unit_calls(message: int, calls: int, runs: tuple[tuple[int, int], ...] | None,
                without_last: bool) -> list[tuple[int, int, str]]:
    """One FSDP collective of ``message`` bytes ``calls`` times a step, as FSDP2 issues it: one call a unit (its
    ``foreach_all_gather`` and ``foreach_reduce`` gather and reduce a unit's parameters together), each of its
    share of the bytes, run by run of ``runs`` (headroom.core.memory.static.fsdp_sharding_units; the last, the head's
    never-resharded unit, left out ``without_last``). (bytes a call, calls, what); as given where ``runs`` is None."""
    if runs is None:
        return [(message, calls, "")]
    runs = runs[:-1] if without_last else runs
    total = sum(params * n for params, n in runs)
    return [(message * params // total, calls * n, f", a call a unit ({n} of {params:,} parameters)")
            for params, n in runs if params]


def _bucket_calls(message: int, calls: int, buckets: int, rule: str,
                  each: str = "a call a bucket") -> list[tuple[int, int, str]]:
    """A gradient reduction (or the distributed optimizer's gather) of ``message`` bytes ``calls`` times a step,
    one call a bucket (headroom.core.timing.gradient_buckets): ``buckets`` calls of the average bucket each,
    which costs what the buckets do as long as a call's time grows linearly with its bytes."""
    if buckets == 1:
        return [(message, calls, f", in {rule}")]
    return [(-(-message // buckets), calls * buckets, f", {each} ({buckets} of them: {rule})")]


def _deepspeed_calls(tensors: list[RankTensor], zero: int, m: int, schedule: DataParallelSchedule, ranks: int,
                     recipe: PrecisionRecipe, norms: bool) -> list[tuple[str, int, int, str, str]]:
    """(op, message bytes, calls, window, what) of DeepSpeed's ZeRO-1 or 2 over ``ranks`` in a step of ``m``
    micro-batches (headroom.core.specs.stack.Stack.deepspeed_zero): the gradients all-reduced whole, a bucket a call
    (headroom.core.timing.gradient_buckets: `deepspeed_order`, `deepspeed_buckets`), every micro-batch under ZeRO-2
    and once under ZeRO-1, beside backward under ``overlap_comm`` or exposed; each communication dtype bucketed
    apart, under an autocast recipe (DeepSpeed's ``torch_autocast``) the linears' in the compute dtype and the rest
    in the gradients' (deepspeed/runtime/torch_autocast.py: ``nn.Linear``'s parameters get the autocast dtype as
    their ``comm_dtype``); then the step's calls (`_deepspeed_step_calls`). ``tensors``: the rank's."""
    order = deepspeed_order(tensors, hooked=zero == 2 or schedule.overlap_grad_reduce)
    reductions = m if zero == 2 else 1
    window = "backward" if schedule.overlap_grad_reduce else ""
    when = ("every micro-batch" if reductions > 1 else "once per step") + ("" if window else ", after backward")
    linears = f" (the linears', in {recipe.compute_dtype}: torch_autocast's)"
    parts = ([(DTYPE_BYTES[recipe.compute_dtype], [t for t in order if t.linear], linears),
              (recipe.grad_bytes, [t for t in order if not t.linear], " (the rest's)")]
             if recipe.autocast else [(recipe.grad_bytes, order, "")])
    calls = []
    for element_bytes, part, which in parts:
        if not part:
            continue
        buckets = deepspeed_buckets((t.elements for t in part), DEEPSPEED_BUCKET_ELEMENTS)
        rule = f"DeepSpeed's buckets of up to {DEEPSPEED_BUCKET_ELEMENTS:,} elements"
        calls += [("all_reduce", message, n, window, f"DeepSpeed: gradients{which} {when}, all-reduced whole{how}")
                  for message, n, how in _bucket_calls(sum(buckets) * element_bytes, reductions, len(buckets), rule)]
    return calls + [(op, message, n, "", what) for op, message, n, what in
                    _deepspeed_step_calls(tensors, ranks, recipe, norms)]


def _deepspeed_step_calls(tensors: list[RankTensor], ranks: int, recipe: PrecisionRecipe,
                          norms: bool) -> list[tuple[str, int, int, str]]:
    """(op, message bytes, calls, what) of DeepSpeed's ZeRO-1 and 2 inside the optimizer's step, over ``ranks``
    (deepspeed/runtime/zero/stage_1_and_2.py ``step``): with ``norms``, the gradients' norm all-reduced a parameter
    group at a time (a 4-byte scalar) and, under its bf16 (16-bit parameters), an overflow flag (a byte); then each
    group's updated parameters all-gathered in one call (``all_gather_into_tensor_dp_groups``), the group's flat
    buffer padded to a multiple of twice the ranks (``nccl_start_alignment_factor``). The groups are the HF
    Trainer's two: the matrices, weight-decayed, and the norms and biases (transformers' ``get_decay_parameter_names``).
    ``tensors``: the rank's."""
    groups = [(size, what) for size, what in ((sum(t.elements for t in tensors if t.matrix), "matrices"),
                                              (sum(t.elements for t in tensors if not t.matrix), "norms and biases"))
              if size]
    calls = []
    if norms:
        norm = "DeepSpeed: the gradients' norm in the optimizer's step, a call a parameter group,"
        calls.append(("all_reduce", 4, len(groups), norm))
        if recipe.param_bytes == 2:
            calls.append(("all_reduce", 1, 1, "DeepSpeed: its bf16 overflow flag in the optimizer's step,"))
    for size, what in groups:
        padded = -(-size // (2 * ranks)) * 2 * ranks
        calls.append(("all_gather", padded * recipe.param_bytes, 1,
                      f"DeepSpeed: updated parameters ({what}: a parameter group) in the optimizer's step, exposed,"))
    return calls


def _sharding_collectives(zero: int, m: int, schedule: DataParallelSchedule, ranks: int, p: int, kept: int,
                          recipe: PrecisionRecipe, in_fp8: int = 0) -> list[tuple[str, int, int, int, bool, str, str]]:
    """(op, message bytes, calls, group size, over the reshard group, window, what) of one sharding group's
    collectives in a step of ``m`` micro-batches: ``p`` parameters over ``ranks`` ranks, ``kept`` of them in a
    unit FSDP does not reshard after forward.

    Zero 0: the gradients all-reduced once or every micro-batch (`DataParallelSchedule.reductions`), behind
    backward, or after it, exposed (``overlap_grad_reduce`` off: Megatron-LM's default). Zero 1 under
    ``zero_optimizer`` (DDP under torch's ZeroRedundancyOptimizer): the same all-reduce, and the updated parameters
    broadcast in the optimizer's step, exposed (DeepSpeed's zero 1 and 2 are `_deepspeed_calls`'). Zero 1 otherwise:
    reduce-scattered once, zero 2 every micro-batch, the same way; the updated parameters all-gathered once,
    behind the next step's first forward, or after the optimizer step, exposed (``overlap_param_gather``
    off). Zero 3 (FSDP): parameters gathered in the compute dtype in
    forward (every micro-batch, or once where nothing frees them between) and, for the units resharded after
    forward, again in backward over all the ranks or the k a shard was kept over; the gradients
    reduce-scattered once or every micro-batch, in the gradients' dtype (fp32 under amp-bf16, torchtitan's
    default reduce dtype). ``in_fp8`` of the parameters are gathered in fp8, a byte each (Megatron-LM's
    ``--fp8-param-gather``)."""
    grads = p * recipe.grad_bytes
    params = p * recipe.param_bytes - in_fp8 * (recipe.param_bytes - 1)
    gathered = p * recipe.activation_bytes - in_fp8 * (recipe.activation_bytes - 1)
    fp8 = " (the block weights in fp8)" if in_fp8 else ""
    reductions = schedule.reductions(m)
    every = "once per step" if reductions == 1 else "every micro-batch"
    reduced = "backward" if schedule.overlap_grad_reduce else ""
    after = "" if reduced else ", after backward"
    if zero == 0:
        return [("all_reduce", grads, reductions, ranks, False, reduced, f"gradients {every}{after}")]
    if zero == 1 and schedule.zero_optimizer:
        return [("all_reduce", grads, reductions, ranks, False, reduced, f"gradients {every}{after}"),
                ("broadcast", params, 1, ranks, False, "",
                 "updated parameters once per step, each from the rank that updated it, in the optimizer step")]
    if zero in (1, 2):
        calls = 1 if zero == 1 else m
        gathered_in = "forward" if schedule.overlap_param_gather else ""
        return [("reduce_scatter", grads, calls, ranks, False, reduced,
                 f"gradients {'once per step' if calls == 1 else 'every micro-batch'}{after}"),
                ("all_gather", params, 1, ranks, False, gathered_in, f"updated parameters{fp8} once per step, "
                 + ("during the next forward" if gathered_in else "after the optimizer step"))]
    forward, backward = schedule.forward_gathers(m), schedule.backward_gathers(m)
    calls = [("all_gather", gathered, forward, ranks, False, "forward",
              f"FSDP: parameters in the compute dtype{fp8}, forward, "
              + ("every micro-batch" if forward == m else "once per step (kept gathered between micro-batches)"))]
    if backward and p > kept:
        size = schedule.backward_gather_ranks(ranks)
        calls.append(("all_gather", (p - kept) * gathered // p, backward, size, size != ranks, "backward",
                      "FSDP: parameters resharded after forward, again in backward, every micro-batch"))
    calls.append(("reduce_scatter", grads, reductions, ranks, False, "backward", f"FSDP: gradients {every}"))
    return calls


def total_seconds(terms: Iterable[CommTerm]) -> float:
    """Communication time if nothing overlapped."""
    return sum(term.seconds for term in terms)


@dataclass(frozen=True, slots=True)
class Overlap:
    """One axis's overlappable collectives in one window of a step against the compute of that window."""

    axis: str
    communication_s: float
    """The axis's overlappable collectives in the window, seconds per step."""
    window_s: float
    """The compute they overlap with, seconds per step (`exposed_seconds` says which)."""
    window: str = ""
    """Which compute: ``forward``, ``backward`` or ``attention`` (CommTerm.window)."""

    @property
    def exposed_s(self) -> float:
        """What the window cannot hide."""
        return max(0.0, self.communication_s - self.window_s)

    @property
    def slack_s(self) -> float:
        """The window's time to spare: how much longer the collectives could take before the step waited on
        them (negative: exposed)."""
        return self.window_s - self.communication_s

    @property
    def fill(self) -> float | None:
        """The share of the window the collectives take (over 1: exposed); None with no window."""
        return self.communication_s / self.window_s if self.window_s > 0 else None

    @property
    def name(self) -> str:
        """"dp backward": the axis and its window."""
        return f"{self.axis} {self.window}".strip()

    def text(self) -> str:
        """"dp backward 78.000 s of collectives under 85.000 s of compute (92%): 7.000 s to spare"."""
        share = f" ({self.fill:.0%})" if self.fill is not None else ""
        outcome = (f"{self.slack_s:.3f} s to spare" if self.slack_s >= 0 else f"{self.exposed_s:.3f} s exposed")
        return (f"{self.name} {self.communication_s:.3f} s of collectives under {self.window_s:.3f} s of compute"
                f"{share}: {outcome}")

    def to_dict(self) -> dict[str, object]:
        return {"axis": self.axis, "window": self.window, "communication_s": self.communication_s,
                "window_s": self.window_s, "exposed_s": self.exposed_s, "slack_s": self.slack_s, "fill": self.fill}


def overlaps(terms: Iterable[CommTerm], hideable_s: Mapping[tuple[str, str], float]) -> tuple[Overlap, ...]:
    """Each axis's overlappable collectives against the compute that can hide them, window by window.

    Rule: the overlappable terms of one axis and window (CommTerm.window) hide behind up to
    ``hideable_s[axis, window]`` seconds of compute and the rest is exposed; a pair missing from the mapping
    hides nothing. The caller says how much compute each window holds in a step, e.g. dp's ``backward``: the
    backward passes that reduce gradients (they reduce while earlier layers still run backward); dp's
    ``forward``: the forward passes that gather FSDP's parameters (prefetched a unit ahead); cp's
    ``attention``: the attention compute. Windows are independent: the same compute may hide several axes.
    """
    terms = tuple(terms)
    for key, budget in hideable_s.items():
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0:
            raise ConfigError(f"compute time to hide {' '.join(key)} communication behind must be >= 0 s, "
                              f"got {budget!r}")
    keys = sorted({(t.axis, t.window) for t in terms if t.overlappable})
    return tuple(
        Overlap(axis, sum(t.seconds for t in terms if t.overlappable and (t.axis, t.window) == (axis, window)),
                hideable_s.get((axis, window), 0.0), window)
        for axis, window in keys)


def exposed_seconds(terms: Iterable[CommTerm], hideable_s: Mapping[tuple[str, str], float]) -> float:
    """Communication time the step waits for: every term that cannot overlap (tp, pp) in full, and what each
    axis's overlappable terms leave exposed in each window (`overlaps`)."""
    terms = tuple(terms)
    return (sum(term.seconds for term in terms if not term.overlappable)
            + sum(overlap.exposed_s for overlap in overlaps(terms, hideable_s)))
