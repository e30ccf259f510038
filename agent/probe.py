"""Measure what a forward pass keeps alive for backward, on CPU, CUDA or meta.

Two instruments run together during one forward pass:

1. ``torch.autograd.graph.saved_tensors_hooks`` (the outermost pair) sees every
   tensor autograd saves outside a checkpointed region, including the inputs a
   non-reentrant checkpoint keeps (it saves them through a no-op autograd
   function) and tensors that existed before the forward (token ids,
   parameters).
2. A ``TorchDispatchMode`` records the storage of every tensor an op creates
   during the forward, with a weak reference. After the forward, the storages
   still alive are what the step holds until backward: this also catches what
   autograd's hooks cannot see, such as the outputs a selective-checkpoint
   context caches and the host copies ``save_on_cpu`` makes.

Tensors are deduplicated by storage and counted at their storage's size (a
saved view costs its whole base). Parameters, and the copies made of them
(autocast's 16-bit weights, and the host copies ``save_on_cpu`` makes of a
saved weight), are reported apart from activations. The forward's own output
(the loss) is not counted. On a GPU, tensors in host memory (offloaded) are
reported apart from those on the device.

On the meta device nothing is allocated but storages still exist with their
sizes, so a 70B-scale layer can be probed on a laptop.

Under ``torch.distributed`` a saved tensor may be a DTensor (tensor
parallelism, FSDP): what it costs this rank is its local shard, so every
tensor is counted (and deduplicated) by the storage of its local tensor, with
the local shape. Each tensor also names the submodule (of the probed model)
whose forward created or saved it, so a mismatch can be traced to a layer.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from headroom.agent.heap import older_objects_frozen

_WRAPPERS: tuple[tuple[str, str, str], ...] = (
    ("torch.distributed.tensor", "DTensor", "_local_tensor"),
    ("torch.distributed._functional_collectives", "AsyncCollectiveTensor", "elem"),
)
"""Tensors that wrap the one holding memory, as (module, class, attribute): a DTensor's local shard, an
async collective's result. Looked up among the modules already imported: a tensor of a class whose module
nobody imported cannot exist, and importing DTensor costs a process 0.6 s it needs only for distributed work."""

CAST_OPS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout})
COPY_INTO = torch.ops.aten.copy_.default
"""``save_on_cpu`` with pinned memory allocates a host tensor, then copies the saved one into it."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage this rank pays for: a DTensor's local shard, else ``t`` itself."""
    for module, name, attr in _WRAPPERS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(t, getattr(loaded, name)):
            return _local(getattr(t, attr))
    return t


def storage_key(t: torch.Tensor) -> int:
    """The identity of the storage this rank pays for (a DTensor's local shard's)."""
    return _local(t).untyped_storage()._cdata


@dataclass(frozen=True, slots=True)
class ProbedTensor:
    op: str
    """The op that created the storage ('input' for tensors from before the forward)."""
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    """Bytes of the whole storage."""
    device: str
    kind: str
    """``activation``, ``input`` (token ids, targets), ``parameter`` or ``parameter_copy``."""
    saved_by_autograd: bool
    """Seen by saved_tensors_hooks (False: kept by a checkpoint cache or offload copy)."""
    module: str = ""
    """The probed model's submodule whose forward first saved it for backward (or, if autograd never
    saw it, created it); '' for the model itself."""


@dataclass(slots=True)
class ProbeResult:
    device_type: str = "cpu"
    """Where the model ran; on ``cuda`` the tensors on ``cpu`` are the offloaded ones."""
    tensors: list[ProbedTensor] = field(default_factory=list)

    def bytes(self, kind: str = "activation", device_type: str | None = None) -> int:
        return sum(
            t.nbytes for t in self.tensors
            if t.kind == kind and (device_type is None or t.device.split(":")[0] == device_type)
        )

    @property
    def activation_bytes(self) -> int:
        """Activations and token ids kept for backward, wherever they live."""
        return self.bytes("activation") + self.bytes("input")

    @property
    def device_activation_bytes(self) -> int:
        """Activations and token ids kept on the model's device."""
        return self.bytes("activation", self.device_type) + self.bytes("input", self.device_type)

    @property
    def host_bytes(self) -> int:
        """Everything offloaded to host memory (activations and weight copies); 0 for a model on the CPU."""
        if self.device_type == "cpu":
            return 0
        return sum(self.bytes(kind, "cpu") for kind in ("activation", "input", "parameter_copy"))

    @property
    def parameter_copy_bytes(self) -> int:
        """Copies of parameters kept for backward, wherever they live."""
        return self.bytes("parameter_copy")

    @property
    def device_parameter_copy_bytes(self) -> int:
        return self.bytes("parameter_copy", self.device_type)


class _StorageTracker(TorchDispatchMode):
    """Weakly records the storage of every tensor an op creates."""

    def __init__(self, param_keys: set[int], known: set[int], modules: list[str]) -> None:
        super().__init__()
        self.param_keys, self.known, self.modules = param_keys, known, modules
        self.created: dict[int, tuple[StorageWeakRef, ProbedTensor]] = {}
        self.copy_keys: set[int] = set()

    def _is_weight(self, t: object) -> bool:
        """A parameter, or a copy of one made during this forward."""
        return isinstance(t, torch.Tensor) and (storage_key(t) in self.param_keys or storage_key(t) in self.copy_keys)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is COPY_INTO and self._is_weight(args[1]) and storage_key(args[0]) in self.created:
            # A host buffer save_on_cpu allocated a moment ago now holds a weight.
            key = storage_key(args[0])
            ref, info = self.created[key]
            self.created[key] = (ref, _with(info, kind="parameter_copy"))
            self.copy_keys.add(key)
        from_param = func in CAST_OPS and self._is_weight(args[0])
        # A view shares its input's storage: that storage was not created here.
        inputs = {storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            key = storage_key(t)
            if key in self.known or key in self.created or key in inputs:
                continue
            t = _local(t)
            storage = t.untyped_storage()
            kind = "parameter_copy" if from_param else "activation"
            if from_param:
                self.copy_keys.add(key)
            self.created[key] = (
                StorageWeakRef(storage),
                ProbedTensor(str(func.overloadpacket.__name__), tuple(t.shape), str(t.dtype).removeprefix("torch."),
                             storage.nbytes(), str(t.device), kind, False, self.modules[-1]),
            )
        return out


def probe(model: torch.nn.Module, forward: Callable[[], torch.Tensor], track: bool = True) -> ProbeResult:
    """Run ``forward()`` once and report what stays alive for backward.

    ``forward`` runs the model (under whatever autocast the caller wants) and
    returns the loss; nothing else may keep references to its intermediates.
    Sizes are read after the forward: a storage freed in place by then (FSDP
    resizes a gathered parameter to 0 bytes after its unit's forward) costs
    nothing and is left out. Parameters are the model's before or after the
    forward (FSDP registers its gathered parameters while they are in use).

    ``track=False`` leaves the dispatch mode out, autograd's hooks alone: for compiled blocks, which dynamo runs
    eagerly under a dispatch mode (it would measure the eager blocks). What the hooks cannot see (a selective
    checkpoint's cache, offload copies) is then not measured.
    """
    param_keys = {storage_key(p) for p in model.parameters()}
    device = next(model.parameters()).device.type if param_keys else "cpu"
    # What pack saw, by storage: a description and a weak reference, never the tensor. And pack returns
    # a detached alias (same storage, no grad_fn): an op that saves its own output, packed as itself,
    # would hold its node through the Python tensor, a cycle through C++ that Python's garbage
    # collector cannot see, and every probed forward would leak its whole graph (seen on an H200:
    # ~10 GB a probe).
    saved: dict[int, tuple[StorageWeakRef, ProbedTensor]] = {}
    modules = [""]  # the submodules whose forward is running, innermost last

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in saved:
            local = _local(t)
            storage = local.untyped_storage()
            saved[key] = (StorageWeakRef(storage), ProbedTensor(
                "input", tuple(local.shape), str(local.dtype).removeprefix("torch."), storage.nbytes(),
                str(local.device), "input", True, modules[-1]))
        return t.detach()

    def enter(name: str) -> Callable[..., None]:
        def hook(*_) -> None:
            modules.append(name)
        return hook

    def leave(*_) -> None:  # a forward hook that returned something would replace the module's output
        modules.pop()

    hooks = []
    for name, module in model.named_modules():
        if name:
            # First before, last after the module's own hooks (a parallel style's input and output
            # redistribution belongs to the module it prepares).
            hooks.append(module.register_forward_pre_hook(enter(name), prepend=True))
            hooks.append(module.register_forward_hook(leave, always_call=True))
    tracker = _StorageTracker(param_keys, known=set(param_keys), modules=modules)
    with _young_garbage_collected():
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), tracker if track else nullcontext():
                loss = forward()
        finally:
            for hook in hooks:
                hook.remove()
    param_keys |= {storage_key(p) for p in model.parameters()}
    output_keys = {storage_key(t) for t in tree_leaves(loss) if isinstance(t, torch.Tensor)}
    result = ProbeResult(device_type=device)
    for key, (ref, info) in tracker.created.items():
        nbytes = _alive_bytes(ref)
        if key in output_keys or not nbytes:
            continue
        changes = {"saved_by_autograd": key in saved, "nbytes": nbytes}
        if key in saved:  # named after the module that kept it (a block's input is kept by that block)
            changes["module"] = saved[key][1].module
        if key in param_keys:
            changes["kind"] = "parameter"
        result.tensors.append(_with(info, **changes))
    for key, (ref, info) in saved.items():
        nbytes = _alive_bytes(ref)
        if key in tracker.created or not nbytes:
            continue
        kind = "parameter" if key in param_keys else "input"
        result.tensors.append(_with(info, op=kind, kind=kind, nbytes=nbytes))
    del loss  # only now: the graph it holds is what kept the storages above alive
    return result


@contextmanager
def _young_garbage_collected() -> Iterator[None]:
    """Collect, on leaving, the garbage made inside: storages that only a reference cycle keeps alive.

    Such a storage is garbage the collector has not reached yet, not something backward needs, so whether
    it counts must not depend on when the collector last ran. (A buffer a collective's backend still holds
    is another matter: headroom.agent.rank.settled.) The collection walks only what the block made (headroom.agent.heap):
    a probe runs hundreds of times in a test process that holds half a million objects.
    """
    with older_objects_frozen():
        yield
        gc.collect()


def _alive_bytes(ref: StorageWeakRef) -> int:
    """The storage's size now: 0 once it is gone or was resized to nothing."""
    storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
    return 0 if storage is None else storage.nbytes()


def _with(info: ProbedTensor, **changes) -> ProbedTensor:
    fields = {name: getattr(info, name) for name in ProbedTensor.__slots__}
    return ProbedTensor(**(fields | changes))
