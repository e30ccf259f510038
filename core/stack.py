"""Training stacks: where the framework the user trains with saves other tensors than another.

Only what the core models differently is here; the rest of a stack's kernels
is the reference decoder's (core/ledger.py).

- ``torch``: plain PyTorch, as the agent's reference decoder uses it: DTensor
  tensor/sequence parallelism, FSDP2, ``torch.utils.checkpoint`` with its
  defaults (early stop), and an op-selective policy that caches the output of
  every matmul and fused attention kernel. Under sequence parallelism a
  column-parallel linear's input is all-gathered by DTensor and autograd keeps
  the gathered, full-sequence tensor.
- ``torchtitan``: the same kernels and parallelism under torchtitan's own
  activation checkpointing (torchtitan 0.3,
  ``torchtitan/distributed/activation_checkpoint.py``): ``FullAC`` checkpoints
  each block with ``early_stop=False``, so backward reruns a block's forward
  whole, its last matmul included; ``SelectiveAC`` (per-op, its default)
  caches the outputs of torch's compute-intensive ops (mm, addmm, bmm, the
  CUDA attention kernels), except every second ``aten.mm`` of a block, which
  it recomputes. It offers no attention-only, segment or offload policy.
- ``megatron`` (Megatron-LM): sequence parallelism keeps the sharded input
  and all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2),
  so every tensor of a block is split by the tensor-parallel ranks. Its
  checkpointing is ``--recompute-granularity full`` (every layer, or every K
  with ``--recompute-num-layers``), ``selective`` (``--recompute-modules
  core_attn``: the attention core) and activation offloading
  (``TransformerConfig.cpu_offloading``); it has no op-level policy
  (megatron/training/arguments.py, megatron/core/transformer/transformer_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError
from core.recompute import RecomputePolicy


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    sp_keeps_gathered_input: bool
    """Under sequence parallelism, backward keeps the all-gathered input of column-parallel linears."""
    policies: tuple[str, ...] = ("none", "full", "every", "selective", "op-selective", "offload")
    """The checkpoint policies (RecomputePolicy kinds) the stack offers."""
    early_stop: bool = True
    """A recomputed region stops once it has rebuilt every tensor backward needs (torch's default), skipping a
    trailing matmul whose output nothing saves."""
    every_other_mm: bool = False
    """op-selective caches only the odd-numbered ``aten.mm`` of each block (1st, 3rd, ...) and recomputes the
    rest; addmm and bmm outputs are cached whatever their place."""
    caches_cpu_attention: bool = True
    """op-selective caches the CPU's fused attention kernel (torch's list of compute-intensive ops lacks it)."""

    def check_policy(self, policy: RecomputePolicy) -> None:
        if policy.kind not in self.policies:
            offered = ", ".join("every-K" if kind == "every" else kind for kind in self.policies)
            raise ConfigError(f"the {self.name} stack has no {policy} checkpointing; it offers {offered}")


STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("torch", True),
    Stack("torchtitan", True, policies=("none", "full", "op-selective"), early_stop=False, every_other_mm=True,
          caches_cpu_attention=False),
    Stack("megatron", False, policies=("none", "full", "every", "selective", "offload")),
)}


def get_stack(name: str) -> Stack:
    try:
        return STACKS[name]
    except KeyError:
        raise ConfigError(f"unknown training stack {name!r}; valid: {', '.join(STACKS)}") from None
