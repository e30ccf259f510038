"""Tensor parallelism and FSDP2 for the agent's decoder, the way torchtitan applies them to Llama.

Tensor parallelism (Megatron, Shoeybi et al. 2019) with DTensor
(``torch.distributed.tensor.parallel``), following torchtitan's
``apply_tp`` for Llama:

- q, k, v (or the fused projection of all three, whose rows run kv group by
  kv group), and the MLP's gate and up projections are ``ColwiseParallel``:
  each rank holds 1/tp of their output features (whole heads);
- the output and down projections are ``RowwiseParallel``: each rank holds
  1/tp of their input features and the partial sums are all-reduced;
- with sequence parallelism (Korthikanti et al. 2022) the norms are
  ``SequenceParallel`` (each rank normalises s/tp tokens), attention and MLP
  inputs are all-gathered along the sequence (``PrepareModuleInput``
  Shard(1) -> Replicate) and the row-parallel outputs are reduce-scattered to
  Shard(1) instead of all-reduced, so the residual stream and the dropouts
  between blocks hold s/tp tokens per rank.

How the column-parallel linears take their input is the stack's
(headroom.core.specs.stack.Stack.splits_column_inputs). The reference hands each a plain
tensor, which it makes a replicated DTensor of its own: backward all-reduces
each linear's input gradient whole. torchtitan hands the attention and the
MLP a DTensor (``PrepareModuleInput`` keeps it one): the linears' partial
input gradients add up first and are reduced once per attention and MLP,
reduce-scattered under sequence parallelism.

The attention module reshapes its projections into heads, so its head counts
become the local ones (torchtitan divides ``n_heads`` by tp the same way).
Only the blocks are parallelised: the embedding, final norm and head stay
replicated. Under sequence parallelism the first block's input is split along
the sequence and the last block's output gathered again, so a ``Decoder``
still takes token ids and returns the loss.

FSDP2 (``fully_shard``): each block is one unit; the embedding, final norm
and head are either the root's unit or, as torchtitan wraps Llama, units of
their own (``shard_fully``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from headroom.agent.model import Block, Decoder
from headroom.core.specs.stack import get_stack

Units = Literal["blocks", "torchtitan"]
UNITS: tuple[str, ...] = ("blocks", "torchtitan")


def block_plan(block: Block, sequence_parallel: bool, one_input: bool = False) -> dict[str, object]:
    """torchtitan's tensor-parallel plan for one block (``apply_tp`` for Llama). ``one_input``: the attention's
    and the MLP's column-parallel linears read one DTensor, whose gradient is reduced once (torchtitan);
    otherwise each takes a plain tensor apart (the reference)."""
    row_output = Shard(1) if sequence_parallel else Replicate()
    projections = ("qkv_proj",) if hasattr(block.attn, "qkv_proj") else ("q_proj", "k_proj", "v_proj")
    plan: dict[str, object] = {
        **{f"attn.{name}": ColwiseParallel() for name in projections},
        "attn.o_proj": RowwiseParallel(output_layouts=row_output),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=row_output),
    }
    if block.mlp.swiglu:
        plan["mlp.gate_proj"] = ColwiseParallel()
    if sequence_parallel:
        plan |= {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel()}
    if sequence_parallel or one_input:
        stream = Shard(1) if sequence_parallel else Replicate()
        gather = PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),),
                                    use_local_output=not one_input)
        plan |= {"attn": gather, "mlp": gather}
    return plan


def _one_input(model: Decoder | Block) -> bool:
    """Do the column-parallel linears of ``model``'s stack read one DTensor (``block_plan``)? A lone Block
    runs the reference's way."""
    return isinstance(model, Decoder) and not get_stack(model.stack).splits_column_inputs


def _shard_blocks(blocks: list[Block], mesh: DeviceMesh, sequence_parallel: bool, one_input: bool) -> None:
    """Apply ``block_plan`` to each block, in place, once; its attention then counts this rank's heads."""
    tp = mesh.size()
    for block in blocks:
        attn = block.attn
        if isinstance(attn.o_proj.weight, DTensor):
            raise ValueError("this model is already parallelised: its head counts are per rank already")
        if attn.n_heads % tp or attn.n_kv_heads % tp:
            raise ValueError(f"{attn.n_heads} query and {attn.n_kv_heads} key/value heads do not split over "
                             f"tp {tp}; use a tp that divides both")
        parallelize_module(block, mesh, block_plan(block, sequence_parallel, one_input))
        # The projections now return this rank's heads only.
        attn.n_heads //= tp
        attn.n_kv_heads //= tp


def parallelize_tensor(model: Decoder | Block, mesh: DeviceMesh, sequence_parallel: bool) -> Decoder | Block:
    """Shard every block of ``model`` (a Decoder, or one Block) over the 1-D ``mesh``, in place, once.

    A Block under sequence parallelism takes and returns its rank's s/tp
    tokens (a plain tensor, as between torchtitan's blocks); a Decoder still
    maps token ids to a loss. Every rank must hold the same weights before
    (the same seed): each keeps its shard of what it holds.
    """
    blocks = list(model.blocks) if isinstance(model, Decoder) else [model]
    _shard_blocks(blocks, mesh, sequence_parallel, _one_input(model))
    if sequence_parallel and isinstance(model, Decoder):
        # The embedding's output is replicated: hand each rank its slice of the sequence, gather after.
        parallelize_module(blocks[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
        parallelize_module(blocks[-1], mesh, PrepareModuleOutput(
            output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))
    return model


def parallelize_decoder(model: Decoder, mesh: DeviceMesh, sequence_parallel: bool) -> Decoder:
    """Tensor parallelism over the whole decoder, as torchtitan's ``apply_tp`` shards Llama: the blocks
    (``block_plan``), and the vocabulary: the embedding's rows (``RowwiseParallel``: each rank looks
    up its slice of the vocabulary and the partial embeddings are reduced, or reduce-scattered along
    the sequence under sequence parallelism), the final norm (``SequenceParallel``) and the head's
    columns (``ColwiseParallel``: each rank computes the logits of its 1/tp of the vocabulary, left
    sharded). The loss over sharded logits must run under ``loss_parallel()`` (`vocabulary_loss`),
    its backward too, as Megatron's vocabulary-parallel cross-entropy does.
    """
    if model.positions is not None or model.spec.tied_embeddings:
        raise ValueError(f"{model.spec.name}: vocabulary parallelism here covers untied Llama-style "
                         "decoders (no learned positions, no tied head)")
    _shard_blocks(list(model.blocks), mesh, sequence_parallel, _one_input(model))
    stream = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
        "lm_head": ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        plan["final_norm"] = SequenceParallel()
    parallelize_module(model, mesh, plan)
    return model


def vocabulary_loss():
    """The context the loss and its backward run in when the head's logits are vocabulary-sharded."""
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def shard_fully(model: Decoder, mesh: DeviceMesh, param_dtype: torch.dtype | None = torch.bfloat16,
                reduce_dtype: torch.dtype | None = torch.float32, units: Units = "blocks",
                reshard_after_forward: bool | int = True) -> Decoder:
    """FSDP2 over ``mesh``, parameters gathered in ``param_dtype`` and gradients reduced in ``reduce_dtype``.

    ``units``: ``blocks``, each block a unit and the root (embedding, final
    norm, head) one more, which FSDP keeps gathered from forward to backward;
    or ``torchtitan``, its Llama wrapping: the embedding, each block, the final
    norm with the head (not resharded after forward: backward needs it first),
    then the root, which holds no parameters of its own. ``reshard_after_forward``: FSDP2's, for the
    embedding's and the blocks' units (headroom.core.specs.data_parallel).
    """
    if units not in UNITS:
        raise ValueError(f"FSDP units {units!r} are not one of {', '.join(UNITS)}")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if units == "torchtitan":
        if model.spec.tied_embeddings:
            raise ValueError(f"{model.spec.name}: tied embeddings share a parameter between the embedding "
                             "and head units; use units='blocks'")
        fully_shard(model.embed, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    if units == "torchtitan":
        fully_shard([model.final_norm, model.lm_head], mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What a tensor costs on this rank: a DTensor's local shard, any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t
