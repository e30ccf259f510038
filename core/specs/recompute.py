"""Activation-checkpoint (recompute) policies, named the way users type them.

- ``none``: every layer's activations live until its backward.
- ``full``: each block is checkpointed: only its input is kept; the block's
  forward runs again during backward.
- ``every-K``: segments of K blocks; only each segment's input is kept and a
  whole segment is recomputed at once. ``every-1`` is ``full``.
- ``block-K``: the first K blocks of each pipeline chunk (a stage, or each of
  its virtual stages) are checkpointed one by one, as under ``full``; the
  chunk's other blocks keep everything, as under ``none`` (Megatron-LM's
  ``--recompute-method block --recompute-num-layers K``).
- ``selective``: recompute the attention core only (QK^T, softmax, dropout, PV).
- ``op-selective``: save matmul and attention outputs, recompute the cheap
  elementwise ops around them.
- ``offload``: keep everything, but in host memory (``save_on_cpu``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from headroom.core.errors import ConfigError

PolicyKind = Literal["none", "full", "every", "block", "selective", "op-selective", "offload"]
POLICY_NAMES = ("none", "full", "every-K", "block-K", "selective", "op-selective", "offload")
POLICY_MEANINGS = {
    "none": "every block's activations live until its backward",
    "full": "each block keeps only its input and runs its forward again in backward",
    "every-K": "each segment of K blocks keeps only its input and runs again in backward (every-1 is full)",
    "block-K": "the first K blocks of each pipeline stage (each chunk of it) keep only their input and run again "
               "in backward, the others keep everything (Megatron-LM's --recompute-method block)",
    "selective": "the attention core alone (QK^T, softmax, dropout, PV) runs again in backward",
    "op-selective": "matmul and attention outputs are kept, the cheap elementwise ops around them run again",
    "offload": "everything is kept, in host memory (torch's save_on_cpu)",
}
"""What each policy keeps and reruns, as ``--help`` defines them."""


@dataclass(frozen=True, slots=True)
class RecomputePolicy:
    kind: PolicyKind
    every: int = 0
    """K for ``every-K`` segments and ``block-K``'s checkpointed blocks; 0 otherwise."""

    def __str__(self) -> str:
        return f"{self.kind}-{self.every}" if self.kind in ("every", "block") else self.kind

    @property
    def recomputes_attention(self) -> bool:
        """Only the attention core is checkpointed (selective)."""
        return self.kind == "selective"

    @property
    def caches_matmuls(self) -> bool:
        """Blocks are checkpointed but matmul and attention outputs are cached (op-selective)."""
        return self.kind == "op-selective"

    @property
    def offloads(self) -> bool:
        """Saved tensors go to host memory (offload)."""
        return self.kind == "offload"

    @property
    def recomputes(self) -> bool:
        """Backward runs some of the forward again (every policy but none and offload)."""
        return self.kind not in ("none", "offload")

    @property
    def recomputes_blocks(self) -> bool:
        """Whole blocks run their forward again in backward (full, every-K, and block-K's first K)."""
        return self.kind in ("full", "every", "block")

    def segments(self, n_layers: int) -> int:
        """Checkpointed segments kept as inputs on a stage of ``n_layers`` blocks: L for full, ceil(L/K) for
        every-K, min(K, L) for block-K."""
        if self.kind == "full":
            return n_layers
        if self.kind == "every":
            return -(-n_layers // self.every)
        if self.kind == "block":
            return min(self.every, n_layers)
        return 0

    def segment_layers(self, n_layers: int) -> int:
        """Blocks recomputed together in one segment."""
        if self.kind in ("full", "block"):
            return 1
        if self.kind == "every":
            return min(self.every, n_layers)
        return 0

    def recomputed_layers(self, n_layers: int) -> int:
        """Blocks of a stage of ``n_layers`` whose forward runs again in backward: all of them under full and
        every-K, the first min(K, L) under block-K, none under the other policies."""
        if self.kind == "block":
            return min(self.every, n_layers)
        return n_layers if self.recomputes_blocks else 0


def parse_policy(text: str) -> RecomputePolicy:
    """'none', 'full', 'every-4', 'block-5', 'selective', 'op-selective' or 'offload'."""
    name = text.strip().lower()
    if name in ("none", "full", "selective", "op-selective", "offload"):
        return RecomputePolicy(name)  # type: ignore[arg-type]
    match = re.fullmatch(r"(every|block)-(\d+)", name)
    if match and int(match[2]) >= 1:
        kind, k = match[1], int(match[2])
        if kind == "every":
            return RecomputePolicy("full") if k == 1 else RecomputePolicy("every", k)
        return RecomputePolicy("block", k)
    raise ConfigError(
        f"unknown recompute policy {text!r}; valid: {', '.join(POLICY_NAMES)} (K a positive integer, e.g. every-4)"
    )
