"""Static memory of FSDP2 and DDP on one data-parallel rank, measured.

FSDP2 (``fully_shard``: each block a unit, and the rest either the root's unit
or torchtitan's embedding and norm-with-head units, agent/parallel.py; bf16
gathers, fp32 reductions, fp32 parameters, AdamW), after two optimizer steps:

- ``parameters``, ``gradients``, ``optimizer_states``: each tensor's local
  shard (its numel and dtype) and the bytes of its storage (FSDP pads dim 0 to
  a multiple of the ranks, so the last rank's shard may sit in a larger one);
- ``gathered``: the unsharded (all-gathered) parameters alive at once, sampled
  at every op of forward and backward by a dispatch mode: the units gathered
  together, and their bytes. A unit is gathered from the moment its flat
  all-gather buffer exists (a prefetch) until FSDP frees its parameters;
  the unsharded gradients (compute dtype) backward leaves on the gathered
  parameters are sampled the same way;
- ``memtracker``: torch's own ``FSDPMemTracker`` over one more step: its peak
  by category, and each unit's snapshots (before and after its pre- and
  post-forward and -backward hooks, and its forward and backward peaks);
- ``activations``: what one forward keeps for backward (agent/probe.py), next
  to the same model unsharded in bf16 on one process.

DDP: the bytes of each gradient bucket the reducer all-reduces (read through a
communication hook), per step: the first step's buckets follow the reverse
parameter order, later ones the order gradients became ready.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from headroom.agent.model import Decoder
from headroom.agent.parallel import local_tensor, shard_fully
from headroom.agent.probe import probe
from headroom.agent.rank import settled
from headroom.core.specs.model import ModelSpec

SPEC = ModelSpec(
    name="fsdp-tiny", block="llama", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=176,
    vocab_size=509, max_seq_len=64, tied_embeddings=False, bias="none",
)
"""A Llama shape whose odd vocabulary does not split evenly over two ranks: FSDP pads it."""
SEQ_LEN, MICRO_BATCH, STEPS = 32, 2, 2


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each data-parallel rank trains its own sequences."""
    generator = torch.Generator().manual_seed(100 + rank)
    tokens = torch.randint(0, SPEC.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator)
    return tokens, torch.randint(0, SPEC.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator)


BUCKETED_SPEC = ModelSpec(
    name="ddp-buckets", block="llama", n_layers=8, hidden=512, n_heads=8, n_kv_heads=4, ffn_hidden=1536,
    vocab_size=8192, max_seq_len=64, tied_embeddings=False, bias="none",
)
"""A Llama whose 134 MB of fp32 gradients fill five of DDP's buckets."""


def _decoder(dtype: torch.dtype = torch.float32, spec: ModelSpec = SPEC) -> Decoder:
    torch.manual_seed(0)
    return Decoder(spec, attention="flash").to(dtype).train()


def _shard_rows(named: list[tuple[str, torch.Tensor]]) -> dict:
    """Each tensor's local shard, and the bytes of the distinct storages behind them (FSDP's gradients
    of one unit are views of one flat buffer; its parameters' shards sit in padded ones)."""
    rows, storages = [], {}
    for name, t in named:
        local = local_tensor(t)
        storage = local.untyped_storage()
        storages[storage._cdata] = storage.nbytes()
        rows.append({"name": name, "shape": list(t.shape), "local_shape": list(local.shape),
                     "dtype": str(local.dtype).removeprefix("torch."),
                     "bytes": local.numel() * local.element_size(), "storage_bytes": storage.nbytes()})
    return {"tensors": rows, "bytes": sum(r["bytes"] for r in rows), "storage_bytes": sum(storages.values())}


def _units(model: nn.Module) -> dict[str, object]:
    """FSDP's parameter groups, named by their modules ('' is the root; ``final_norm+lm_head`` is one
    unit over two modules)."""
    names: dict[int, list[str]] = {}
    groups = {}
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                names.setdefault(id(group), []).append(name)
                groups[id(group)] = group
    return {"+".join(names[key]): group for key, group in groups.items()}


def _gathered_bytes(group) -> int:
    """Bytes of a unit's unsharded parameters allocated now: its flat all-gather buffer while one
    exists, each parameter's unsharded storage (FSDP frees them by resizing to 0), and the shard over
    fewer ranks it keeps after forward under ``reshard_after_forward=k``."""
    result = group._all_gather_result
    total = result.all_gather_output.untyped_storage().nbytes() if result is not None else 0
    for param in group.fsdp_params:
        for t in (*getattr(param, "all_gather_outputs", ()), *getattr(param, "_unsharded_inner_tensors", ())):
            total += t.untyped_storage().nbytes()
        kept = getattr(param, "_sharded_post_forward_param_data", None)
        total += kept.untyped_storage().nbytes() if kept is not None else 0
    return total


def _unsharded_grad_bytes(group) -> int:
    total = 0
    for param in group.fsdp_params:
        grad = getattr(getattr(param, "_unsharded_param", None), "grad", None)
        if grad is not None:
            total += local_tensor(grad).untyped_storage().nbytes()
    return total


class _GatheredSampler(TorchDispatchMode):
    """At every op: which units hold unsharded parameters, and how many bytes they hold."""

    def __init__(self, units: dict[str, object]) -> None:
        super().__init__()
        self.units = units
        self.phase = "forward"
        self.peak_bytes = 0
        self.peak_units: list[str] = []
        self.most_units: list[str] = []
        self.unit_bytes = dict.fromkeys(units, 0)
        """The most bytes each unit held gathered."""
        self.unsharded_grad_bytes = dict.fromkeys(units, 0)
        """The most bytes of unsharded gradients each unit held."""
        self.timeline: list[dict] = []
        """Each change of the set of gathered units: phase, units, bytes."""

    def sample(self) -> None:
        held = {name: n for name, group in self.units.items() if (n := _gathered_bytes(group))}
        for name, n in held.items():
            self.unit_bytes[name] = max(self.unit_bytes[name], n)
        for name, group in self.units.items():
            self.unsharded_grad_bytes[name] = max(self.unsharded_grad_bytes[name], _unsharded_grad_bytes(group))
        total = sum(held.values())
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_units = total, sorted(held)
        if len(held) > len(self.most_units):
            self.most_units = sorted(held)
        state = {"phase": self.phase, "units": sorted(held), "bytes": total}
        if not self.timeline or self.timeline[-1] | {"phase": self.phase} != state:
            self.timeline.append(state)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sample()
        return out


def measure_fsdp(mesh: DeviceMesh, units: str = "blocks") -> dict:
    """FSDP2 over ``mesh`` with ``units`` (headroom.agent.parallel.shard_fully): sharded state, gathered units
    and activations on this rank."""
    rank = dist.get_rank()
    model = shard_fully(_decoder(), mesh, units=units)
    groups = _units(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens, targets = _batch(rank)
    parameters = _shard_rows(list(model.named_parameters()))

    sampler = _GatheredSampler(groups)
    gradients: dict = {}
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        if step == STEPS - 1:  # the steady state: every buffer exists already
            with sampler:
                sampler.phase = "forward"
                loss = model(tokens, targets)
                sampler.phase = "backward"
                loss.backward()
            gradients = _shard_rows([(n, p.grad) for n, p in model.named_parameters()])
        else:
            loss = model(tokens, targets)
            loss.backward()
        losses.append(loss.item())
        optimizer.step()
    states = _shard_rows([(f"{name}.{key}", value) for name, p in model.named_parameters()
                          for key, value in optimizer.state[p].items()])
    names = {id(p): n for n, p in model.named_parameters()}
    measured = probe(model, lambda: settled(model(tokens, targets)))
    unsharded = _decoder(torch.bfloat16)
    reference = probe(unsharded, lambda: unsharded(tokens, targets))
    # Last: a tracker that fails may leave its hooks on the model.
    memtracker, loss = _memtracker_step(model, optimizer, tokens, targets)
    losses.append(loss)
    return {
        "world_size": mesh.size(),
        "wrapping": units,
        "spec": SPEC.to_dict(),
        "seq_len": SEQ_LEN, "micro_batch": MICRO_BATCH,
        "losses": losses,
        "parameters": parameters,
        "gradients": gradients,
        "optimizer_states": states,
        "units": {name: [names[id(p.sharded_param)] for p in group.fsdp_params] for name, group in groups.items()},
        "gathered": {"peak_bytes": sampler.peak_bytes, "peak_units": sampler.peak_units,
                     "most_units_at_once": sampler.most_units, "unit_bytes": sampler.unit_bytes,
                     "unsharded_grad_bytes": sampler.unsharded_grad_bytes, "timeline": sampler.timeline},
        "memtracker": memtracker,
        "activations": {
            "bytes": measured.activation_bytes,
            "parameter_bytes": measured.bytes("parameter"),
            "unsharded_bf16_bytes": reference.activation_bytes,
            "tensors": [{"module": t.module, "op": t.op, "shape": list(t.shape), "dtype": t.dtype,
                         "bytes": t.nbytes, "kind": t.kind} for t in measured.tensors],
        },
    }


def _memtracker_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
                     targets: torch.Tensor) -> tuple[dict, float]:
    """One more step under torch's FSDPMemTracker (a private tool: a failure is recorded, not raised)."""
    try:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    except ImportError as err:
        return {"error": f"ImportError: {err}"}, float("nan")

    def categories(snapshot: dict) -> dict[str, int]:
        (by_kind,) = snapshot.values()  # one device: the CPU
        return {str(getattr(kind, "value", kind)): n for kind, n in by_kind.items()}

    tracker = FSDPMemTracker(model, optimizer)
    tracker.track_inputs((tokens, targets))
    try:
        with tracker:
            optimizer.zero_grad(set_to_none=True)
            loss = model(tokens, targets)
            loss.backward()
            optimizer.step()
        units = {}
        for name, module in model.named_modules():
            stats = tracker.memory_tracking.get(module)
            if isinstance(module, FSDPModule) and stats is not None:
                units[name] = {state.value: categories(snapshots[-1])
                               for state, snapshots in stats.snapshots.items() if snapshots}
        return {"peak": categories(tracker.get_tracker_snapshot("peak")), "units": units}, loss.item()
    except Exception as err:  # noqa: BLE001 - the tool is private; the rest of the record still counts
        return {"error": f"{type(err).__name__}: {err}"}, float("nan")


def measure_ddp(spec: ModelSpec = SPEC) -> dict:
    """DDP with its defaults (25 MiB buckets, a 1 MiB first bucket, gradients apart from the buckets)."""
    rank = dist.get_rank()
    model = DistributedDataParallel(_decoder(spec=spec))
    buckets: list[list[dict]] = [[] for _ in range(STEPS)]
    step = 0

    def record(state, bucket):
        buffer = bucket.buffer()
        buckets[step].append({"index": bucket.index(), "parameters": len(bucket.parameters()),
                              "bytes": buffer.numel() * buffer.element_size(),
                              "dtype": str(buffer.dtype).removeprefix("torch.")})
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, record)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens, targets = _batch(rank)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        model(tokens, targets).backward()
        optimizer.step()
    return {
        "world_size": dist.get_world_size(),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradient_as_bucket_view": model.gradient_as_bucket_view,
        "buckets": buckets,
    }


def measure_zero1() -> dict:
    """DDP under torch's ZeroRedundancyOptimizer (AdamW), as the agent runs ZeRO-1: each rank's optimizer state
    (its shard: whole tensors) and, for three steps, the c10d collectives the profiler sees and the bytes of DDP's
    buckets: the second step's forward also broadcasts DDP's rebuilt bucket assignment (two calls), so the third
    is the steady one."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.profiler import ProfilerActivity, profile

    rank = dist.get_rank()
    model = DistributedDataParallel(_decoder())
    buckets: list[int] = []

    def record(state, bucket):
        buffer = bucket.buffer()
        buckets.append(buffer.numel() * buffer.element_size())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, record)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    tokens, targets = _batch(rank)
    steps = []
    for _ in range(3):
        buckets.clear()
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            optimizer.zero_grad(set_to_none=True)
            model(tokens, targets).backward()
            optimizer.step()
        calls = [event.name for event in profiled.events() if event.name.startswith("c10d::")]
        steps.append({"all_reduces": calls.count("c10d::allreduce_"), "broadcasts": calls.count("c10d::broadcast_"),
                      "bucket_bytes": list(buckets)})
    state = [v for s in optimizer.optim.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "parameters": len(list(model.parameters())),
        "state_bytes": sum(v.numel() * v.element_size() for v in state if v.dim() > 0),
        "state_scalars": sum(v.dim() == 0 for v in state),
        "steps": steps,
    }
