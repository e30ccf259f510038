"""Training stacks: where the framework the user trains with saves other tensors than another.

Only what the core models differently is here; the rest of a stack's kernels
is the reference decoder's (core/ledger.py).

- ``torch`` (PyTorch DTensor tensor/sequence parallelism, FSDP2: torchtitan):
  under sequence parallelism a column-parallel linear's input is all-gathered
  by DTensor and autograd keeps the gathered, full-sequence tensor.
- ``megatron`` (Megatron-LM): sequence parallelism keeps the sharded input
  and all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2),
  so every tensor of a block is split by the tensor-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    sp_keeps_gathered_input: bool
    """Under sequence parallelism, backward keeps the all-gathered input of column-parallel linears."""


STACKS: dict[str, Stack] = {s.name: s for s in (Stack("torch", True), Stack("megatron", False))}


def get_stack(name: str) -> Stack:
    try:
        return STACKS[name]
    except KeyError:
        raise ConfigError(f"unknown training stack {name!r}; valid: {', '.join(STACKS)}") from None
