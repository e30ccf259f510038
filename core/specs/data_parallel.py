"""How a stack runs its data-parallel ranks through one optimizer step: FSDP's resharding, and when gradients
are reduced.

A layout may set either (headroom.core.specs.layout.Layout); left None, each takes its stack's default:

- ``reshard_after_forward`` (zero 3), FSDP2's argument of that name: True under every stack but torchtitan
  under a pipeline, whose default policy is ``reshard_after_forward = not pp_enabled`` ("For PP, by default do
  not reshard after forward to avoid per-microbatch all-gathers", ``get_fsdp_reshard_after_forward_policy``,
  torchtitan/distributed/fsdp.py, torchtitan 0.3). FSDP2's own default is True, and accelerate's FSDP2
  plugin (the HF Trainer's) keeps it. Whatever the policy, the unit of the final norm and the head is not
  resharded after forward: backward needs it first (torchtitan's wrapping under its default policy, and the
  agent's, headroom.agent.parallel.shard_fully).
- ``defer_gradient_sync`` (zero 0 and 3): the HF Trainer runs every micro-batch but the last under
  accelerate's ``no_sync`` (transformers/trainer.py), which for FSDP2 is ``set_requires_gradient_sync(False)``
  (accelerate/accelerator.py); Megatron-LM's schedules run them under its DDP wrapper's ``no_sync``
  (megatron/core/pipeline_parallel/schedules.py). torchtitan's and the agent's loops call backward on every
  micro-batch with nothing around it (torchtitan/trainer.py ``train_step``), so FSDP reduce-scatters and DDP
  all-reduces every micro-batch; under a pipeline, though, ``torch.distributed.pipelining`` defers the
  reduction to the last micro-batch itself (``PipelineStage.backward_maybe_with_nosync``).

- ``overlap_grad_reduce`` (zero 0-2) and ``overlap_param_gather`` (zero 1-2): on under every stack but
  Megatron-LM (headroom.core.specs.stack.Stack.overlaps_data_parallel), whose DDP runs them off unless asked.
  Two ZeRO-1s gather inside the optimizer's step whatever the setting (`DataParallelSchedule.gathers_in_step`):
  torch's ZeroRedundancyOptimizer (the reference stack's) and DeepSpeed's, whose ZeRO-2 does too (the HF
  Trainer's). DeepSpeed's ``overlap_comm`` is ``overlap_grad_reduce``.

Under a ``torch.distributed.pipelining`` schedule a stage's FSDP units also stay gathered from one
micro-batch's backward to the next's forward (``set_reshard_after_backward(False)`` until the last backward),
so with ``reshard_after_forward`` False each unit is gathered once per step.

Deferred, FSDP2 keeps each unit's unsharded gradient from one backward to the next, upcast to the reduce
dtype (``FSDPParam.to_accumulated_grad_if_needed``, torch/distributed/fsdp/_fully_shard/_fsdp_param.py):
the rank's whole parameters' worth, in fp32 under amp-bf16, where every-micro-batch reduction keeps only its
shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.specs.layout import Layout
from headroom.core.specs.stack import get_stack


@dataclass(frozen=True, slots=True)
class DataParallelSchedule:
    """What the data-parallel ranks do in a step, resolved from the layout and its stack."""

    reshard_after_forward: bool | int
    """FSDP: free a unit's gathered parameters after its forward (True), keep them (False), or keep a shard
    over this many ranks."""
    defer_gradient_sync: bool
    """Gradients are reduced in the last micro-batch's backward only."""
    keeps_gathered_between_micro_batches: bool
    """FSDP units are not resharded after a backward that is not the step's last (torch's pipelining)."""
    overlap_grad_reduce: bool = True
    """DDP's and ZeRO-1/2's gradient reductions run while backward does; False: after it, exposed."""
    overlap_param_gather: bool = True
    """ZeRO-1/2's updated parameters are gathered during the next forward; False: after the step, exposed."""
    zero_optimizer: bool = False
    """ZeRO-1 is DDP under torch's ``ZeroRedundancyOptimizer`` (headroom.core.specs.stack.Stack.zero_optimizer): the
    gradients all-reduced as without sharding, the updated parameters broadcast in the step, exposed."""
    deepspeed: bool = False
    """ZeRO-1 and 2 are DeepSpeed's (headroom.core.specs.stack.Stack.deepspeed_zero): the gradients all-reduced whole
    in its buckets, the updated parameters all-gathered inside the step, exposed."""

    def gathers_in_step(self, zero: int) -> bool:
        """The updated parameters of ZeRO-1 or 2 are gathered (or broadcast) inside the optimizer's step, before
        anything else runs, whatever ``overlap_param_gather`` says: torch's ZeroRedundancyOptimizer's ZeRO-1 and
        DeepSpeed's ZeRO-1 and 2."""
        return (zero == 1 and self.zero_optimizer) or (zero in (1, 2) and self.deepspeed)

    def forward_gathers(self, micro_batches: int) -> int:
        """FSDP all-gathers of each unit in forward per step: every micro-batch's, or the first's alone when
        nothing frees the parameters in between."""
        kept = self.reshard_after_forward is False and self.keeps_gathered_between_micro_batches
        return 1 if kept else micro_batches

    def backward_gathers(self, micro_batches: int) -> int:
        """FSDP all-gathers per step in backward of each unit resharded after forward (not the head's)."""
        return 0 if self.reshard_after_forward is False else micro_batches

    def backward_gather_ranks(self, sharding_ranks: int) -> int:
        """Ranks a backward all-gather runs over: all that shard the parameters, or the k a shard was kept over."""
        reshard = self.reshard_after_forward
        return sharding_ranks if isinstance(reshard, bool) else reshard

    def reductions(self, micro_batches: int) -> int:
        """Gradient reductions (FSDP's reduce-scatter, DDP's all-reduce) per step."""
        return 1 if self.defer_gradient_sync else micro_batches

    def text(self, zero: int) -> str:
        """"FSDP units resharded after forward; gradients reduced every micro-batch", for sharding stage
        ``zero`` (which of the settings apply to it)."""
        reshard = self.reshard_after_forward
        units = {True: "resharded after forward", False: "kept gathered from forward to backward"}.get(
            reshard, f"kept as a shard over {reshard} ranks from forward to backward")
        if self.keeps_gathered_between_micro_batches:
            units += ", and from one micro-batch to the next"
        as_set = zero in (0, 3) or (zero == 1 and self.zero_optimizer)  # DDP's, FSDP's: deferred or not
        sync = ("once per step (the last micro-batch)" if self.defer_gradient_sync else "every micro-batch") \
            if as_set else {1: "once per step", 2: "every micro-batch"}[zero]
        if zero < 3:
            sync += ", beside backward" if self.overlap_grad_reduce else ", after backward (exposed)"
        if zero == 1 and self.zero_optimizer:
            sync += "; updated parameters broadcast in the optimizer step (exposed)"
        elif zero in (1, 2) and self.deepspeed:
            sync += ", all-reduced whole; updated parameters gathered in the optimizer step (exposed)"
        elif zero in (1, 2):
            sync += ("; updated parameters gathered during the next forward" if self.overlap_param_gather
                     else "; updated parameters gathered after the optimizer step (exposed)")
        return (f"FSDP units {units}; " if zero == 3 else "") + f"gradients reduced {sync}"

    def to_dict(self, zero: int) -> dict[str, object]:
        return {"reshard_after_forward": self.reshard_after_forward, "defer_gradient_sync": self.defer_gradient_sync,
                "keeps_gathered_between_micro_batches": self.keeps_gathered_between_micro_batches,
                "overlap_grad_reduce": self.overlap_grad_reduce,
                # ZeroRedundancyOptimizer's broadcasts and DeepSpeed's gathers run inside the step, whatever the
                # stack's default
                "overlap_param_gather": self.overlap_param_gather and not self.gathers_in_step(zero),
                "text": self.text(zero)}


def data_parallel_schedule(layout: Layout, stack: str) -> DataParallelSchedule:
    """The layout's settings, each left None taking ``stack``'s default (the module's docstring, with sources)."""
    s = get_stack(stack)
    pipelined = layout.pp > 1
    reshard = layout.reshard_after_forward
    if reshard is None:
        reshard = s.fsdp_reshards_under_pipeline or not pipelined
    defer = layout.defer_gradient_sync
    if defer is None:
        defer = s.defers_gradient_sync or (pipelined and s.torch_pipelining)
    reduce, gather = layout.overlap_grad_reduce, layout.overlap_param_gather
    return DataParallelSchedule(reshard_after_forward=reshard, defer_gradient_sync=defer,
                                keeps_gathered_between_micro_batches=pipelined and s.torch_pipelining,
                                overlap_grad_reduce=s.overlaps_data_parallel if reduce is None else reduce,
                                overlap_param_gather=s.overlaps_data_parallel if gather is None else gather,
                                zero_optimizer=s.zero_optimizer, deepspeed=s.deepspeed_zero)
