"""Bytes of live storages through a stretch of torch code, counted op by op (tests of the ledger's moments)."""

from __future__ import annotations

import gc

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages alive, counted at each op's return (its inputs and outputs both alive), and their peak.

    Storages that existed before are counted only when named (``existing``) or when an op returns them.
    """

    def __init__(self, *existing: torch.Tensor) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self.live = self.peak = 0
        for t in existing:
            self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage._cdata not in self.storages:
            self.storages[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
            self.live += storage.nbytes()

    def _sweep(self) -> None:
        for key, (ref, nbytes) in list(self.storages.items()):
            if ref.expired():
                del self.storages[key]
                self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        self.peak = max(self.peak, self.live)
        return out

    def mark(self) -> int:
        """The bytes alive now, cyclic garbage collected first; the peak starts again from here."""
        gc.collect()
        self._sweep()
        self.peak = self.live
        return self.live
