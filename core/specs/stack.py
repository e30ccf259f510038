"""Training stacks: where the framework the user trains with saves other tensors than another.

Only what the core models differently is here; the rest of a stack's kernels
is the reference decoder's (core/memory/ledger.py). Each fact names its source.

- ``reference``: plain PyTorch, as the agent's reference decoder uses it:
  DTensor tensor/sequence parallelism, FSDP2, ``torch.utils.checkpoint``
  with its defaults (early stop), torch's own RMSNorm (the fused kernel
  where the device has one, headroom.core.specs.devices), RoPE tables made in each layer,
  an unfused SwiGLU, and an op-selective policy that caches the output of
  every matmul and fused attention kernel. Under sequence parallelism a
  column-parallel linear's input is all-gathered by DTensor and autograd
  keeps the gathered, full-sequence tensor. The agent measures this stack;
  ``torch`` is its former name, still read from older stores.
- ``torchtitan``: the same kernels and parallelism with torchtitan's fused
  attention input projection and under its own activation checkpointing
  (torchtitan 0.3). Its Llama 3 and Qwen3 configurations build q, k and v as
  one linear, ``wqkv`` (``fuse_qkv=True``, ``torchtitan/models/llama3/__init__.py``;
  ``FusedQKVLinear`` in ``torchtitan/models/common/attention.py``), whose rows
  run kv group by kv group (each group's query heads, then its key and value
  head) and whose output is split into contiguous q, k and v: one ``aten.mm``
  instead of three, and under autocast one 16-bit copy of its input instead
  of three. Its checkpointing
  (``torchtitan/distributed/activation_checkpoint.py``): ``FullAC`` checkpoints
  each block with ``early_stop=False``, so backward reruns a block's forward
  whole, its last matmul included; ``SelectiveAC`` (per-op, its default)
  caches the outputs of torch's compute-intensive ops (mm, addmm, bmm, the
  CUDA attention kernels), except every second ``aten.mm`` of a block, which
  it recomputes. It offers no attention-only, segment or offload policy.
  Under tensor parallelism its loss is its own ``_LossParallelCrossEntropy``
  (``torchtitan/components/loss.py``) over vocabulary-sharded logits: it
  keeps the fp32 log-probabilities and the targets, as ``F.cross_entropy``
  does, but its forward holds the fp32 logits, their shifted copy and the
  log-probabilities at once, and its backward builds three fp32 tensors over
  the vocabulary (zeros with the targets' -1 scattered in, the exp of the
  log-probabilities, their sum) before the product it returns.
- ``megatron`` (Megatron-LM with Transformer Engine, its default
  ``--transformer-impl``): sequence parallelism keeps the sharded input and
  all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2), so
  every tensor of a block is split by the tensor-parallel ranks. Its kernels
  are fused: TE's RMSNorm keeps its input and an fp32 rstd per row
  (``transformer_engine/pytorch/module/layernorm_linear.py`` saves ``inputmat``
  and ``rsigma``); fc1 projects gate and up as one ``[gate | up]`` matrix and
  ``bias_swiglu_impl`` keeps only that input, recomputing SiLU in backward
  (``megatron/core/fusions/fused_bias_swiglu.py``); fused RoPE keeps the fp32
  ``freqs`` table the rotary module makes once per forward
  (``megatron/core/models/common/embeddings/rope_utils.py``, TE's
  ``FusedRoPEFunc``). Its loss, ``vocab_parallel_cross_entropy``
  (``megatron/core/tensor_parallel/cross_entropy.py``, megatron-core 0.16),
  copies the logits to fp32, turns that copy into the softmax in place and
  keeps it with a boolean target mask and the int64 targets; backward writes
  the gradient into the kept softmax, so the loss's moments add only the
  16-bit logits and their 16-bit gradient where reference adds two fp32
  tensors over the vocabulary. ``pretrain_gpt.py``'s ``loss_func`` then
  multiplies the per-token losses by the fp32 loss mask, which it keeps. Its
  checkpointing is ``--recompute-granularity full``
  (every layer, or every K with ``--recompute-num-layers``), ``selective``
  (``--recompute-modules core_attn``: the attention core) and activation
  offloading (``TransformerConfig.cpu_offloading``); it has no op-level
  policy (megatron/training/arguments.py, megatron/core/transformer/transformer_config.py).
  Full and every-K run through ``tensor_parallel.checkpoint``
  (``megatron/core/tensor_parallel/random.py``, ``CheckpointFunction``),
  which reruns the segment's forward whole in backward: no early stop.
- ``hf``: transformers' modeling code under the HF Trainer (transformers
  5, ``models/llama/modeling_llama.py``; Mistral, Qwen2/3 and Phi-3 share it;
  ``models/gemma/modeling_gemma.py``, whose ``GemmaRMSNorm`` scales by
  ``1 + weight`` in fp32 and so keeps its normalised tensor in fp32).
  ``LlamaRMSNorm`` is a composite on every device: it upcasts its input to
  fp32, multiplies by ``rsqrt(mean(x^2) + eps)``, casts back and then scales
  by the weight, so backward keeps the fp32 input, the rsqrt, the normalised
  tensor in the input's dtype and the output. ``LlamaRotaryEmbedding`` makes
  cos and sin once per forward in the compute dtype and every layer reads
  them (Gemma 3 one pair per kind of layer). Its SDPA attention hands a
  sliding-window layer an explicit mask once the sequence is as long as the
  window (``masking_utils``), and then repeats grouped k/v heads for it
  (``integrations/sdpa_attention.py``). The Trainer's ``gradient_checkpointing`` checkpoints every decoder
  layer (non-reentrant: each layer keeps its inputs, and the shared cos, sin
  and positions once); it has no other policy. The traced ledger
  (``headroom estimate --trace``) is this stack's independent check.
  Its parallelism is transformers' own (``from_pretrained(...,
  distributed_config=DistributedConfig(tp_size=T))``, transformers 5.25,
  ``distributed/``), which the Trainer hands to accelerate with FSDP2 over
  the data-parallel ranks (ZeRO-3), or to DeepSpeed's ZeRO-1 and 2
  (``Stack.deepspeed_zero``), and accelerate's ring attention for cp. Tensor
  parallelism follows the model's plan (``LlamaConfig.base_model_tp_plan``):
  q, k, v, gate and up column-parallel, o and down row-parallel, the
  embedding split by vocabulary (``embedding_rowwise``, its partial lookups
  summed), and the head column-parallel with its output gathered
  (``LlamaForCausalLM._tp_plan``: ``colwise_gather_output``), so every rank
  holds the whole vocabulary's logits and computes the loss over them. The
  norms and residual stream are replicated: ``DistributedConfig``'s
  ``enable_sequence_parallel`` is "not wired up yet". Its pipeline
  (``distributed/pipeline_parallel.py``) only sends hidden states forward,
  for inference; the Trainer has no pipeline schedule.
- ``hf-liger``: the same under the HF Trainer's ``use_liger_kernel=True``,
  which patches the model with Liger's Triton kernels (liger-kernel 0.8,
  ``liger_kernel/transformers/monkey_patch.py``: ``apply_liger_kernel_to_llama``
  and its Mistral and Qwen2/3 twins, RoPE, RMSNorm, SwiGLU and the fused
  linear cross-entropy on). ``LigerRMSNormFunction`` keeps its input, the
  weight and an fp32 rstd per row (``ops/rms_norm.py``, casting mode llama),
  as a fused RMSNorm does; ``LigerSiLUMulFunction`` keeps the gate and up
  projections' outputs and recomputes SiLU in backward (``ops/swiglu.py``);
  ``LigerRopeFunction`` keeps cos and sin only, as transformers' rotation does
  (``ops/rope.py``). ``LigerFusedLinearCrossEntropyFunction``
  (``ops/fused_linear_cross_entropy.py``) takes the final norm's output and
  the head's weight, makes the logits a chunk of rows at a time and computes
  the gradients in forward: it keeps the input's gradient (tokens x h, the
  input's dtype) and the head weight's (V x h, the weight's dtype) and no
  logits. A chunk is ``next_pow2(ceil(tokens / ceil(V / h)))`` rows (at most
  the tokens): about the bytes of the head's input, in the matmul's dtype.
  Its backward only scales the two gradients in place. The loss needs the
  whole vocabulary on a rank, so the stack has no tensor parallelism (nor,
  as ``hf``, a pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from headroom.core.errors import ConfigError
from headroom.core.specs.recompute import RecomputePolicy

RmsNorm = Literal["torch", "fused", "hf"]
"""``torch``: torch's RMSNorm (fused where the device has the kernel, else its composite); ``fused``: the stack's
own fused kernel on every device; ``hf``: transformers' composite, in its order."""
Rope = Literal["per-layer", "shared-fp32", "shared"]
"""Where RoPE's cos and sin come from and what rotation keeps: tables made in each layer and cast per call
(``per-layer``), one fp32 table for the whole forward (``shared-fp32``: Megatron's fused kernel), or cos and sin made
once in the compute dtype (``shared``: transformers)."""
Swiglu = Literal["unfused", "fc1", "silu-mul"]
"""What a gated MLP keeps (headroom.core.memory.forward_trace._swiglu): the gate, SiLU's output, up and their product (``unfused``);
one fc1 output ``[gate | up]`` and the product, SiLU recomputed (``fc1``: Megatron's fused kernel); or the
separate gate and up outputs and the product, SiLU recomputed (``silu-mul``: Liger's)."""
Loss = Literal["log-softmax", "vocab-parallel", "loss-parallel", "fused-linear"]
"""How the cross-entropy over the vocabulary is computed: ``F.cross_entropy`` on an fp32 copy of the logits, which
keeps the fp32 log-probabilities (``log-softmax``); Megatron's ``vocab_parallel_cross_entropy``, which turns its
fp32 copy into the softmax in place, keeps that, and writes the gradient into it in backward (``vocab-parallel``);
under tensor parallelism, torchtitan's own ``_LossParallelCrossEntropy`` (``loss-parallel``; without it
``F.cross_entropy``); or Liger's fused linear cross-entropy, which makes the head's logits a chunk at a time and
keeps the gradients of its input and weight instead (``fused-linear``)."""


DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's ``reduce_bucket_size`` default, in elements (deepspeed/runtime/zero/config.py), which Headroom's
DeepSpeed export leaves as it is."""


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    sp_keeps_gathered_input: bool
    """Under sequence parallelism, backward keeps the all-gathered input of column-parallel linears."""
    policies: tuple[str, ...] = ("none", "full", "every", "block", "selective", "op-selective", "offload")
    """The checkpoint policies (RecomputePolicy kinds) the stack offers."""
    early_stop: bool = True
    """A recomputed region stops once it has rebuilt every tensor backward needs (torch's default), skipping a
    trailing matmul whose output nothing saves."""
    every_other_mm: bool = False
    """op-selective caches only the odd-numbered ``aten.mm`` of each block (1st, 3rd, ...) and recomputes the
    rest; addmm and bmm outputs are cached whatever their place."""
    fused_qkv: bool = False
    """q, k and v come from one linear (``[q | k | v]`` per kv group) and are copied out of its output."""
    caches_reduce_scatters: bool = False
    """op-selective keeps each reduce-scatter's output (torchtitan's save list), so its recompute does not run them
    again."""
    caches_cpu_attention: bool = True
    """op-selective caches the CPU's fused attention kernel (torch's list of compute-intensive ops lacks it)."""
    rms_norm: RmsNorm = "torch"
    rope: Rope = "per-layer"
    swiglu: Swiglu = "unfused"
    loss: Loss = "log-softmax"
    tensor_parallel: bool = True
    """The stack can split a layer over tensor-parallel ranks."""
    context_parallel: Literal["torch", "transformer-engine"] = "torch"
    """Whose ring attention runs context parallelism: torch's (``torch.distributed.tensor.experimental``
    ``_context_parallel/_attention.py``, torch 2.13: its keys and values all-gathered once a layer by default,
    ``_cp_options.rotate_method = ALL_GATHER``, or passed rank to rank by ``set_rotate_method("alltoall")``;
    their gradients passed rank to rank cp times either way, in fp32, ``convert_to_f32``; torchtitan and
    accelerate, whose ``cp_comm_strategy`` defaults to ``allgather``, run it) or Transformer Engine's
    (Megatron-LM's ``--cp-comm-type``, default ``p2p``: keys and values passed rank to rank, and their
    gradients with them in backward; ``allgather``: gathered, exposed, ``AttnFuncWithCPAndKVAllGather``)."""
    overlaps_tensor_parallel: bool = False
    """It can run each block's tensor-parallel collectives beside its GEMMs (``Layout.tp_overlap``): Megatron-LM's
    ``--tp-comm-overlap`` (Transformer Engine's userbuffers: megatron/training/arguments.py, off by default) and
    torchtitan's ``--compile.enable_async_tensor_parallel`` (inductor's micro-pipelined TP under
    torch.compile: torchtitan/distributed/compile.py, off by default)."""
    overlaps_expert_parallel: bool = False
    """It can run one micro-batch's expert all-to-alls beside another's compute (``Layout.ep_overlap``):
    Megatron-LM's ``--overlap-moe-expert-parallel-comm`` (megatron/core/pipeline_parallel/combined_1f1b.py: the
    first micro-batch's forward runs alone, then each forward beside the previous micro-batch's backward, "EP
    A2A in forward step is hidden by the attention/mlp computation in the backward step, and vice versa", the
    last backward alone; off by default; it needs the all-to-all or flex dispatcher, no full or every-K recompute and a
    16-bit model: megatron/core/transformer/transformer_config.py)."""
    hierarchical_dispatch: bool = False
    """Its experts' tokens can cross nodes by DeepEP or HybridEP rather than an all-to-all (``Layout.ep_comm``,
    headroom.core.timing.expert_dispatch): Megatron-LM's ``--moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep|hybridep``, torchtitan's ``moe_comm_backend`` (``make_token_dispatcher_config``
    in torchtitan/models/common/config_utils.py: ``standard``, ``deepep``, ``hybridep``)."""
    sequence_parallel: bool = True
    """Under tensor parallelism it can split the norms' and dropouts' sequence over the ranks (Korthikanti et
    al. 2022)."""
    pipeline_parallel: bool = True
    """It can train a model split into pipeline stages."""
    splits_column_inputs: bool = False
    """Under tensor parallelism each column-parallel linear (q, k, v, gate, up) takes its input apart, as a plain
    tensor made replicated again, so backward all-reduces each one's input gradient whole; otherwise the
    attention's and the MLP's linears read one input, whose gradient is reduced once (reduce-scattered under
    sequence parallelism): Megatron-LM's, and torchtitan's ``PrepareModuleInput`` handing on a DTensor."""
    gathers_logits: bool = False
    """Under tensor parallelism the head's column-parallel output is all-gathered: every rank computes the loss
    over the whole vocabulary, not its slice of it."""
    fused_softmax: bool = False
    """The explicit attention scales, masks and takes the softmax of its scores in one kernel, the causal mask
    implied rather than made (Megatron-LM's ``FusedScaleMaskSoftmax``, megatron/core/fusions/fused_softmax.py):
    a timing fact (headroom.core.timing.step_ops), what is kept is the same."""
    transformers_modules: bool = False
    """The stack runs transformers' own modeling code: it accounts for the Llama family only
    (headroom.core.specs.config.hf_stack_covers)."""
    measured: bool = False
    """The agent's decoder runs this stack's kernels, so ``headroom agent train`` can measure it."""
    defers_gradient_sync: bool = False
    """Its training loop reduces the data-parallel gradients only in the last micro-batch's backward, whatever
    the layout (headroom.core.specs.data_parallel); without it, only under a pipeline that does so itself."""
    overlaps_data_parallel: bool = True
    """Its data-parallel gradient reduction runs while backward does (torch's DDP: bucketed all-reduces launched
    by autograd hooks; FSDP2's reduce-scatters in its post-backward) and the updated parameters of ZeRO-1 and 2
    are gathered during the next forward; False: Megatron-LM, whose ``DistributedDataParallelConfig`` has
    ``overlap_grad_reduce`` and ``overlap_param_gather`` off by default (megatron/core/distributed/
    distributed_data_parallel_config.py; ``--overlap-grad-reduce``, ``--overlap-param-gather``): the gradients
    are reduced after the last backward and the parameters gathered after the optimizer step, exposed."""
    sharding_stages: tuple[int, ...] = (0, 1, 2, 3)
    """The data-parallel sharding stages (``Layout.zero``) it runs. torchtitan: 0 and 3 only, its data
    parallelism replicating (``dp_replicate``) or sharding (``dp_shard``) parameters, gradients and optimizer
    state together through FSDP2 (torchtitan/distributed/fsdp.py), no ZeRO-1 or 2; FSDP2 kept gathered from
    forward to backward (``--reshard-after-forward false``) is its nearest. Plain PyTorch: 0, 1 and 3, its ZeRO-1
    DDP with ``ZeroRedundancyOptimizer``; its ZeRO-2 is FSDP's ``SHARD_GRAD_OP``, which gathers the parameters
    before forward and frees them only after backward (torch/distributed/fsdp/api.py, ``ShardingStrategy``):
    FSDP2's ``reshard_after_forward=False``, zero 3 kept gathered, not a stage of its own (`fsdp_zero2`). The others
    run every stage: Megatron-LM its distributed optimizer and Megatron-FSDP (``--data-parallel-sharding-strategy``),
    the HF Trainer DeepSpeed's stages and FSDP."""
    zero_optimizer: bool = False
    """Its ZeRO-1 is torch's DDP with ``ZeroRedundancyOptimizer`` (the agent's, headroom.agent.train_ranks): the
    gradients all-reduced whole in DDP's buckets, and after the step each updated parameter broadcast from the
    rank that owns it, a call a tensor, before anything else runs (``_sync_params``, torch/distributed/optim/
    zero_redundancy_optimizer.py, ``parameters_as_bucket_view`` off by default); its partition keeps tensors
    whole (headroom.core.memory.static.zero_optimizer_share). Otherwise ZeRO-1 reduce-scatters the gradients
    and all-gathers the parameters (Megatron-LM's distributed optimizer, DeepSpeed's stage 1)."""
    deepspeed_zero: bool = False
    """Its ZeRO-1 and 2 are DeepSpeed's (the HF Trainer's ``deepspeed`` config; deepspeed/runtime/zero/
    stage_1_and_2.py, DeepSpeed 0.19): the gradients all-reduced whole, each rank then keeping its partition
    (``use_multi_rank_bucket_allreduce``, on by default), in buckets of ``reduce_bucket_size`` elements
    (headroom.core.timing.gradient_buckets), every micro-batch under ZeRO-2 and in the last micro-batch's backward
    under ZeRO-1; inside the optimizer's step, the gradients' norm all-reduced a parameter group at a time (and
    under its bf16 an overflow flag), then each group's updated flat partitions all-gathered in one call
    (``all_gather_dp_groups``, deepspeed/runtime/utils.py), before the step returns. Through each backward it holds
    its reduction buffers (``contiguous_gradients``, on by default): `DEEPSPEED_BUCKET_ELEMENTS` of the parameters'
    dtype for each communication dtype, two of them under ``overlap_comm`` (``setup_buckets``), whatever the
    model's size (headroom.core.memory.static)."""
    replicates_through_fsdp: bool = False
    """Its data parallelism without sharding (zero 0) is FSDP2 over a replicating mesh dimension, which
    all-reduces each unit's gradients in a call of its own rather than in DDP's buckets: torchtitan's
    ``dp_replicate`` (torchtitan/distributed/fsdp.py, ``resolve_fsdp_mesh``; its ``ReplicateModule`` "inherits
    from FSDPModule")."""
    torch_pipelining: bool = False
    """Its pipeline runs on ``torch.distributed.pipelining``, whose stages defer the gradient reduction and keep
    FSDP's units gathered from one micro-batch to the next (``PipelineStage.backward_maybe_with_nosync``)."""
    zero_bubble: Literal["run", "searched"] | None = None
    """Runs torch's zero-bubble ZB-V schedule (``ScheduleZBVZeroBubble``; headroom.core.specs.schedule_order):
    ``searched`` where its configuration names it (torchtitan's ``pipeline_parallel_schedule = "ZBVZeroBubble"``)
    and the layout search tries it; ``run`` where it is planned when asked for (plain torch, whose
    pipelining offers it, but the search keeps to 1f1b and interleaved there: the agent's pipeline runs 1f1b
    and gpipe, and a search with ZB-V takes up to twice as long)."""
    weighted_stages: bool = False
    """Its pipeline splits the layers by torchtitan's rule, the embedding and the head counted as a block each,
    even where they divide (headroom.core.specs.stages); otherwise evenly."""
    fsdp_reshards_under_pipeline: bool = True
    """Under a pipeline its FSDP still frees each unit's parameters after forward (FSDP2's default); False:
    torchtitan's default policy keeps them (``reshard_after_forward = not pp_enabled``)."""
    summary: str = ""

    @property
    def cp_comm(self) -> str:
        """The context-parallel exchange it runs by default: all-gather under torch's, ring under Transformer
        Engine's (``context_parallel``)."""
        return "all-gather" if self.context_parallel == "torch" else "ring"

    def loss_at(self, tp: int) -> Loss:
        """The cross-entropy the stack computes at this tensor-parallel degree: torchtitan's own only above 1."""
        return "log-softmax" if self.loss == "loss-parallel" and tp == 1 else self.loss

    def kernels(self, tp: int) -> tuple[RmsNorm, Rope, Swiglu, Loss]:
        """What the stack's kernels keep that another's may not: its RMSNorm, RoPE, SwiGLU and cross-entropy."""
        return self.rms_norm, self.rope, self.swiglu, self.loss_at(tp)

    def check_data_parallel(self, zero: int, overlap_param_gather: bool | None, defer_gradient_sync: bool | None,
                            zero_given: bool = True) -> None:
        """What the stack's data parallelism refuses of a layout's: a sharding stage it does not run and the
        settings its stages do not take (``zero_given``: the stage was asked for, not filled in for a setting)."""
        if zero_given:
            self.check_sharding(zero)
        self.check_param_gather(zero, overlap_param_gather, zero_given)
        self.check_deferred_sync(zero, defer_gradient_sync)

    @property
    def fsdp_zero2(self) -> bool:
        """Its ZeRO-2 is FSDP kept gathered from forward to backward (zero 3, ``reshard_after_forward`` False),
        ``SHARD_GRAD_OP``: it shards through FSDP and has no ZeRO-2 of its own."""
        return 3 in self.sharding_stages and 2 not in self.sharding_stages

    def check_sharding(self, zero: int) -> None:
        if zero not in self.sharding_stages:
            stages = ", ".join(map(str, self.sharding_stages))
            nearest = ("; its ZeRO-2 is FSDP's SHARD_GRAD_OP, parameters kept gathered from forward to backward: "
                       "--zero 3 --reshard-after-forward false") if zero == 2 and self.fsdp_zero2 else ""
            raise ConfigError(f"the {self.name} stack has no ZeRO-{zero}; it shards at --zero {stages} "
                              f"(0 replicates, 3 shards parameters, gradients and optimizer state){nearest}")

    def check_param_gather(self, zero: int, overlap_param_gather: bool | None, zero_given: bool = True) -> None:
        """``--overlap-param-gather``, given, needs a ZeRO-1 or 2 that gathers the updated parameters apart from the
        step: none under a stack without those stages, not the ZeRO-1 of ``zero_optimizer`` (``zero_given``: the
        stage was asked for, not filled in for the setting), and on, not DeepSpeed's (``deepspeed_zero``)."""
        if overlap_param_gather is None:
            return
        if self.zero_optimizer and (zero == 1 and zero_given or 2 not in self.sharding_stages):
            others = ", or use --zero 2" if 2 in self.sharding_stages else \
                f" (the {self.name} stack's ZeRO-2 is FSDP's, zero 3, which gathers before each forward anyway)"
            raise ConfigError(f"--overlap-param-gather under --stack {self.name}: its ZeRO-1 is torch's "
                              "ZeroRedundancyOptimizer, which broadcasts the updated parameters inside the optimizer's "
                              f"step, before anything else runs; leave it out{others}")
        if not {1, 2} & set(self.sharding_stages):
            raise ConfigError(f"--overlap-param-gather under --stack {self.name}: it applies to ZeRO-1 and 2, which "
                              f"the {self.name} stack has none of (it shards at --zero "
                              f"{', '.join(map(str, self.sharding_stages))}); leave it out")
        if overlap_param_gather and self.deepspeed_zero:
            raise ConfigError(f"--overlap-param-gather on under --stack {self.name}: its ZeRO-1 and 2 are DeepSpeed's, "
                              "which all-gathers the updated parameters inside the optimizer's step, before anything "
                              "else runs; leave it out")

    def check_deferred_sync(self, zero: int, defer_gradient_sync: bool | None) -> None:
        """``--defer-gradient-sync``, given, at zero 1: only where ZeRO-1 is DDP (``zero_optimizer``)."""
        if zero == 1 and defer_gradient_sync is not None and not self.zero_optimizer:
            raise ConfigError(f"defer-gradient-sync under --stack {self.name} --zero 1: its distributed optimizer "
                              "reduces the gradients once per step already; leave it out")

    def check_policy(self, policy: RecomputePolicy) -> None:
        if policy.kind not in self.policies:
            offered = ", ".join(f"{kind}-K" if kind in ("every", "block") else kind for kind in self.policies)
            raise ConfigError(f"the {self.name} stack has no {policy} checkpointing; it offers {offered}")


STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("reference", True, splits_column_inputs=True, measured=True, torch_pipelining=True, zero_bubble="run",
          zero_optimizer=True, sharding_stages=(0, 1, 3),
          summary="plain PyTorch, the agent's decoder: every policy"),
    Stack("torchtitan", True, policies=("none", "full", "op-selective"), early_stop=False, every_other_mm=True,
          sharding_stages=(0, 3), replicates_through_fsdp=True,
          caches_reduce_scatters=True, torch_pipelining=True, zero_bubble="searched", fsdp_reshards_under_pipeline=False, weighted_stages=True,
          overlaps_tensor_parallel=True, hierarchical_dispatch=True,
          fused_qkv=True, caches_cpu_attention=False, loss="loss-parallel", measured=True,
          summary="its fused q/k/v projection and activation checkpointing: none, full, op-selective"),
    Stack("megatron", False, policies=("none", "full", "every", "block", "selective", "offload"), early_stop=False,
          rms_norm="fused", fused_softmax=True, defers_gradient_sync=True, overlaps_tensor_parallel=True,
          overlaps_data_parallel=False, overlaps_expert_parallel=True, hierarchical_dispatch=True,
          context_parallel="transformer-engine",
          rope="shared-fp32", swiglu="fc1", loss="vocab-parallel",
          summary="Transformer Engine's fused kernels, its in-place cross-entropy, sequence parallelism and "
                  "checkpointing: none, full, every-K, selective, offload"),
    Stack("hf", True, policies=("none", "full"), rms_norm="hf", rope="shared", transformers_modules=True,
          defers_gradient_sync=True, deepspeed_zero=True,
          sequence_parallel=False, pipeline_parallel=False, splits_column_inputs=True, gathers_logits=True,
          summary="transformers' modules under the HF Trainer: none, full; its own tensor parallelism (no sequence "
                  "parallelism, logits gathered), no pipeline"),
    Stack("hf-liger", True, policies=("none", "full"), rms_norm="fused", rope="shared", swiglu="silu-mul",
          loss="fused-linear", tensor_parallel=False, sequence_parallel=False, pipeline_parallel=False,
          transformers_modules=True, defers_gradient_sync=True, deepspeed_zero=True,
          summary="the same with use_liger_kernel (Liger's RMSNorm, SwiGLU, RoPE and fused linear cross-entropy, "
                  "no logits kept): none, full, no tensor or pipeline parallelism"),
)}
FORMER_NAMES = {"torch": "reference"}
"""Names a stack had before, as older stores and bundles hold them."""


def stack_name(name: str) -> str:
    """The stack's current name, for one an older store holds too; an unknown name is refused."""
    name = FORMER_NAMES.get(name, name)
    if name not in STACKS:
        raise ConfigError(f"unknown training stack {name!r}; valid: {', '.join(STACKS)}")
    return name


def get_stack(name: str) -> Stack:
    return STACKS[stack_name(name)]
