"""TrainConfig: how one step is run (everything but the model's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from headroom.core.divisors import divisors_near
from headroom.core.errors import ConfigError
from headroom.core.specs.data_parallel import (
    DataParallelSchedule,
    data_parallel_schedule,
)
from headroom.core.specs.float8 import (
    Float8Recipe,
    get_float8,
    mx_misfits,
    te_misfits,
    te_units,
)
from headroom.core.specs.layout import SINGLE, Layout
from headroom.core.specs.model import SIZE_LIMITS, ModelSpec
from headroom.core.specs.precision import (
    PrecisionRecipe,
    get_precision,
    optimizer_state_bytes,
)
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.stack import STACKS, Stack, get_stack, stack_name
from headroom.core.specs.stages import chunk_layers, stage_layers
from headroom.core.timing.expert_dispatch import HIERARCHICAL

COMPILED_STACKS = ("reference", "torchtitan")
COMPILED_POLICIES = ("none", "full")
"""Where a compiled block's saved set was measured (TrainConfig.compile)."""

MAX_MICRO_BATCH = 2**20
"""Sequences in one micro-batch at most: far beyond any device's memory, bounded so work stays bounded."""
BF16_END_BLOCKS = 1
"""Blocks at each end of the model `TrainConfig.first_last_bf16` keeps in bf16: Megatron-LM's
``--num-layers-at-start-in-bf16`` and ``--num-layers-at-end-in-bf16`` as Megatron-Bridge's recipe sets them."""

Attention = Literal["flash", "standard"]
ATTENTIONS = ("flash", "standard")


def hf_stack_covers(spec: ModelSpec, stack: str = "hf") -> bool:
    """The transformers stacks (headroom.core.specs.stack) account for transformers' Llama modules: dense, RMSNorm before each
    sublayer, Llama's attention (Mistral's sliding window included); ``hf`` also for Gemma's, Gemma 2's and
    Gemma 3's (RMSNorm in fp32, scaled embeddings, norms after each sublayer, soft-capping, sliding-window layers
    among full ones, with RoPE tables of their own), which Liger patches with kernels of its own. Mixtures of
    experts, latent attention and GPT blocks keep other tensors."""
    if spec.block != "llama" or spec.is_moe or spec.is_mla:
        return False
    gemma = (spec.norm_offset, spec.scaled_embedding, spec.post_norms, spec.attention_softcap, spec.logit_softcap,
             spec.sliding_window_pattern, spec.local_rope)
    return stack == "hf" or not any(gemma)


def cp_comm(layout: Layout, stack: str) -> str:
    """How context-parallel ranks exchange keys and values: the layout's setting, else the stack's default."""
    return layout.cp_comm or get_stack(stack).cp_comm


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    seq_len: int
    """Tokens per sequence s."""
    micro_batch: int = 1
    """Sequences per forward/backward pass b (per data-parallel rank)."""
    precision: str = "amp-bf16"
    """``fp32``, ``amp-bf16``, ``bf16-pure`` or ``bf16-master`` (headroom.core.specs.precision)."""
    fp8: str = "off"
    """FP8 recipe of the linears: ``off`` or a key of headroom.core.specs.float8.FLOAT8_RECIPES."""
    compile: bool = False
    """Each block compiled with ``torch.compile`` (torchtitan's ``--compile.enable``: its ``apply_compile``
    compiles every transformer block, its activation checkpoint inside): inductor's partitioner chooses what the
    block keeps for backward (headroom.core.memory.trace.Trace.compiled)."""
    fp8_param_gather: bool = False
    """Megatron-LM's ``--fp8-param-gather``: under a Transformer Engine recipe the block weights are held in fp8
    (the distributed optimizer keeps their fp32 master) and all-gathered in fp8 (headroom.core.specs.float8);
    without an FP8 recipe it has nothing to act on."""
    first_last_bf16: bool = False
    """Megatron-LM's ``--first-last-layers-bf16`` (with ``--num-layers-at-start-in-bf16`` and
    ``--num-layers-at-end-in-bf16`` at `BF16_END_BLOCKS`): the model's first and last blocks run outside the FP8
    recipe, in bf16 (megatron/core/fp8_utils.py's ``get_fp8_context`` gives them a null context, and
    ``fp8_model_init`` none, so their weights are not fp8 parameters), as Megatron-Bridge's current-scaling recipe
    sets it (``bf16_with_fp8_current_scaling_mixed``). Under current scaling only: megatron-core asserts it away
    from delayed scaling."""
    optimizer: str = "adamw"
    """``sgd``, ``sgd-momentum``, ``adagrad``, ``adam`` or ``adamw``."""
    attention: Attention = "flash"
    """``flash`` (fused SDPA, no s x s tensor kept) or ``standard`` (explicit softmax(QK^T)V)."""
    dropout: float = 0.0
    """Dropout probability (``gpt`` blocks only)."""
    recompute: RecomputePolicy = field(default_factory=lambda: RecomputePolicy("none"))
    """Activation-checkpoint policy."""
    stack: str = "reference"
    """Training stack whose kernels and checkpointing apply (headroom.core.specs.stack): ``reference``, ``torchtitan``, ``megatron``,
    ``hf`` or ``hf-liger``; the former name ``torch`` reads as ``reference``."""
    layout: Layout = SINGLE
    """How the run is spread over GPUs (headroom.core.specs.layout): tp, sp, pp, cp, dp and the sharding stage."""

    def __post_init__(self) -> None:
        for name, limit in (("seq_len", SIZE_LIMITS["max_seq_len"]), ("micro_batch", MAX_MICRO_BATCH)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
            if value > limit:
                raise ConfigError(f"{name.replace('_', '-')} {value:,} is beyond anything trainable (at most {limit:,})")
        if not isinstance(self.layout, Layout):
            raise ConfigError(f"layout must be a headroom.core.specs.layout.Layout, got {self.layout!r}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"attention {self.attention!r} is not one of {', '.join(ATTENTIONS)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        get_precision(self.precision)
        object.__setattr__(self, "stack", stack_name(self.stack))
        get_stack(self.stack).check_policy(self.recompute)
        if self.layout.cp > 1 and self.attention != "flash":
            raise ConfigError("context parallelism runs ring attention on fused kernels: use --attention flash")
        optimizer_state_bytes(self.optimizer)
        if self.float8 is not None:
            self._check_fp8(self.float8)
        if self.compile not in (True, False):
            raise ConfigError(f"compile must be on or off, got {self.compile!r}")
        if self.compile:
            self._check_compile()
        if self.fp8_param_gather not in (True, False):
            raise ConfigError(f"fp8-param-gather must be on or off, got {self.fp8_param_gather!r}")
        if self.fp8_param_gather and self.stack != "megatron":
            raise ConfigError(f"--fp8-param-gather is Megatron-LM's (its fp8 parameters and their fp8 all-gather); "
                              f"the {self.stack} stack has none: use --stack megatron, or leave it off")
        if self.first_last_bf16 not in (True, False):
            raise ConfigError(f"first-last-layers-bf16 must be on or off, got {self.first_last_bf16!r}")
        if self.first_last_bf16 and (not self.te_fp8 or self.float8.delayed):
            raise ConfigError(f"--first-last-layers-bf16 keeps the model's first and last blocks out of Transformer "
                              f"Engine's current scaling (megatron-core refuses it under delayed scaling), and --fp8 is "
                              f"{self.fp8}: use --fp8 te-current or te-mxfp8, or leave it off")

    @property
    def float8(self) -> Float8Recipe | None:
        """The FP8 recipe the block linears train under (headroom.core.specs.float8), or None."""
        return get_float8(self.fp8)

    @property
    def te_fp8(self) -> bool:
        """The block linears run a Transformer Engine FP8 recipe (its fp8 inputs kept, its fp8 weights cached)."""
        recipe = self.float8
        return recipe is not None and recipe.saves_fp8

    def bf16_blocks(self, layers: int, first: bool, last: bool) -> int:
        """Of a pipeline stage's ``layers`` blocks, those `first_last_bf16` runs in bf16: the model's first on the
        ``first`` stage (which holds layer 0, under the interleaved schedule in its first chunk) and its last on the
        ``last``."""
        if not self.first_last_bf16:
            return 0
        return min(layers, BF16_END_BLOCKS * (int(first) + int(last)))

    @property
    def fp8_params(self) -> bool:
        """The block weights are held in fp8: ``fp8_param_gather`` under a Transformer Engine recipe."""
        return self.fp8_param_gather and self.te_fp8

    def _check_compile(self) -> None:
        """What a compiled block's saved set was measured under (on the CPU, tests/test_compile.py)."""
        if self.stack not in COMPILED_STACKS:
            raise ConfigError(f"--compile on under --stack {self.stack}: torch.compile of the blocks is measured for "
                              f"the {' and '.join(COMPILED_STACKS)} stacks (torchtitan's --compile.enable); use "
                              "--compile off")
        if self.recompute.kind not in COMPILED_POLICIES:
            raise ConfigError(f"--compile on with --recompute {self.recompute}: a compiled block is measured without "
                              "checkpointing and under full (its checkpoint inside the compiled region) only; under "
                              "a per-op policy, measured, inductor keeps only the cached outputs its backward reads, "
                              "not modelled yet: use --recompute none or full, or --compile off")
        if self.runs_autocast:
            raise ConfigError(f"--compile on with --precision {self.precision} and no FSDP: compiled autocast is not "
                              "measured; use a bf16 recipe, or amp-bf16 with --zero 3 (FSDP's mixed precision)")
        if self.float8 is not None:
            raise ConfigError(f"--compile on with --fp8 {self.fp8}: a compiled float8 block is not measured yet; use "
                              "--compile off or --fp8 off")

    def check_sharding(self) -> None:
        """What the configuration needs of its layout's sharding beyond what a Layout checks: a stage its stack
        runs, Megatron's fp8 parameters its distributed optimizer, and no expert parallelism under DeepSpeed's
        ZeRO-1 and 2. Checked where a configuration is planned or
        estimated, not in every TrainConfig: the core's own keys (a layout with the data parallelism taken out)
        need not hold it, nor a step the agent measured (its own data parallelism under a stack's kernels)."""
        if self.dp * self.layout.cp > 1:
            get_stack(self.stack).check_data_parallel(self.zero, self.layout.overlap_param_gather,
                                                      self.layout.defer_gradient_sync)
        if self.fp8_params and self.zero == 0 and self.dp * self.layout.cp > 1:
            raise ConfigError("--fp8-param-gather needs Megatron-LM's distributed optimizer, whose fp32 master "
                              "copy it casts into the fp8 weights: use --zero 1 or more")
        if self.layout.ep > 1 and self.zero in (1, 2) and get_stack(self.stack).deepspeed_zero:
            raise ConfigError(f"--ep {self.layout.ep} under --stack {self.stack} --zero {self.zero}: its ZeRO-{self.zero} "
                              "is DeepSpeed's, which reduces experts' gradients over expert groups only for its own "
                              "deepspeed.moe layers, not transformers' experts; use --zero 3, or --ep 1")

    def _check_fp8(self, recipe: Float8Recipe) -> None:
        """What headroom.core.specs.float8 models of a recipe: its stacks, a bf16 input without autocast, and for
        MXFP8 tp 1 and a micro-batch of whole blocks."""
        if self.stack not in recipe.stacks:
            note = f" ({recipe.stacks_note})" if recipe.stacks_note else ""
            raise ConfigError(f"--fp8 {recipe.name} under --stack {self.stack}: {recipe.summary} is run by the "
                              f"{' and '.join(recipe.stacks)} stack{'s' if len(recipe.stacks) > 1 else ''} "
                              f"only{note}; use --fp8 off, or --stack {recipe.stacks[-1]}")
        if self.recipe.compute_dtype != "bf16":
            raise ConfigError(f"--fp8 {recipe.name} with --precision {self.precision}: float8 linears take a bf16 "
                              "input; use a bf16 recipe (bf16-pure, bf16-master, bf16-fp32grad, or amp-bf16 with "
                              "--zero 3)")
        if recipe.block and not recipe.saves_fp8 and self.layout.tp > 1:
            raise ConfigError(f"--fp8 {recipe.name} with tp {self.layout.tp}: MXFP8 under tensor parallelism is not "
                              "measured yet; use tp 1, or --fp8 torchao-rowwise")
        if recipe.block and not recipe.saves_fp8 and self.rank_tokens % recipe.block:
            raise ConfigError(f"--fp8 {recipe.name}: a micro-batch's {self.rank_tokens:,} tokens on a rank "
                              f"(micro-batch x seq-len / cp) do not divide by its {recipe.block}-element blocks "
                              "(torchao asserts they do); use a micro-batch or seq-len that makes them")
        if recipe.saves_fp8 and self.recipe.autocast:
            raise ConfigError(f"--fp8 {recipe.name} with --precision {self.precision}: Megatron-LM has no autocast; "
                              "its Transformer Engine linears train bf16 parameters (--bf16): use bf16-master, "
                              "bf16-fp32grad or bf16-pure")
        if self.runs_autocast:
            raise ConfigError(f"--fp8 {recipe.name} with --precision {self.precision} and no FSDP: under autocast "
                              "torchao's Float8Linear casts its input to CUDA's autocast dtype, which is not "
                              "modelled; use --zero 3 (FSDP's mixed precision) or bf16-pure")

    @property
    def dp(self) -> int:
        """Data-parallel ranks."""
        return self.layout.dp

    @property
    def zero(self) -> int:
        """Sharding stage over the data-parallel ranks."""
        return self.layout.zero

    @property
    def recipe(self) -> PrecisionRecipe:
        return get_precision(self.precision)

    @property
    def data_parallel(self) -> DataParallelSchedule:
        """How the data-parallel ranks run a step: FSDP's resharding and when gradients are reduced, the layout's
        settings or the stack's defaults (headroom.core.specs.data_parallel)."""
        return data_parallel_schedule(self.layout, self.stack)

    @property
    def fsdp_mixed_precision(self) -> bool:
        """An autocast recipe under FSDP (zero 3): FSDP gathers 16-bit parameters itself and autocast stays off."""
        return self.recipe.autocast and self.zero == 3

    @property
    def runs_autocast(self) -> bool:
        """Autocast runs the matmuls (not under FSDP's mixed precision)."""
        return self.recipe.autocast and not self.fsdp_mixed_precision

    @property
    def block_param_dtype(self) -> str:
        """Dtype the blocks see their parameters in, and so the residual stream's and the norms' outputs': FSDP's
        mixed precision gathers them in the compute dtype."""
        return self.recipe.compute_dtype if self.fsdp_mixed_precision else self.recipe.param_dtype

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch: b x s."""
        return self.micro_batch * self.seq_len

    @property
    def rank_tokens(self) -> int:
        """Tokens of one micro-batch on one rank: b x s / cp (context parallelism splits the sequence)."""
        return self.micro_batch * self.seq_len // self.layout.cp

    def context_note(self, spec: ModelSpec) -> str | None:
        """Said, not refused, when a RoPE model trains beyond its context window: that is context extension,
        which long-context runs (and context parallelism) exist for; the accounting holds either way."""
        if spec.rotary and self.seq_len > spec.max_seq_len:
            return (f"seq-len {self.seq_len:,} is beyond {spec.name}'s {spec.max_seq_len:,}-token context window: "
                    "training there extends the context (RoPE scaling); memory and time are accounted the same")
        return None

    def unmodelled_policy(self, spec: ModelSpec, policy: RecomputePolicy) -> str | None:
        """Why ``policy`` cannot be accounted for ``spec`` on this stack, or None: torchtitan's per-op
        checkpointing of a mixture of experts (which expert outputs it keeps depends on the routing), and a
        compiled block under a policy it was not measured with."""
        if spec.is_moe and policy.caches_matmuls and get_stack(self.stack).every_other_mm:
            return (f"{spec.name}: {self.stack}'s per-op checkpointing of a mixture of experts caches every second "
                    "matmul, so which experts' outputs it keeps depends on the routing: not modelled")
        if self.compile and policy.kind not in COMPILED_POLICIES:
            return (f"a compiled block is measured without checkpointing and under full only "
                    f"({policy} under torch.compile is not modelled)")
        return None

    def model_notes(self, spec: ModelSpec) -> tuple[str, ...]:
        """What every estimate and plan of ``spec`` says beside its figures: a context extended, and what the
        model's config asks that the accounting does not count (ModelSpec.caveats, and soft-capping where the
        stack leaves it out)."""
        context = self.context_note(spec)
        caveats = (*spec.caveats, *self._softcap_caveats(spec))
        return ((context,) if context else ()) + tuple(f"{spec.name}: {caveat}" for caveat in caveats)

    def _softcap_caveats(self, spec: ModelSpec) -> tuple[str, ...]:
        """Soft-capping as the stack runs it: transformers' modules keep the tanh of capped scores (eager) and
        logits, which the ledger counts; FlashAttention 2 caps inside its kernel; the other stacks do not cap."""
        caveats = []
        transformers = get_stack(self.stack).transformers_modules
        if spec.attention_softcap and not transformers:
            caveats.append(
                f"attention scores soft-capped at {spec.attention_softcap:g} (attn_logit_softcapping), which the "
                f"{self.stack} stack does not do: counted uncapped; --stack hf counts transformers' capped attention")
        elif spec.attention_softcap and self.attention == "flash":
            caveats.append(
                f"attention scores soft-capped at {spec.attention_softcap:g} (attn_logit_softcapping), which SDPA "
                "cannot do: transformers' flash attention for it is FlashAttention 2's (flash_attention_2, 16-bit "
                "on CUDA), counted as keeping what SDPA's flash kernel keeps; --trace cannot run it, and traces "
                "--attention standard (transformers' eager attention)")
        if spec.logit_softcap and not transformers:
            caveats.append(
                f"final logits soft-capped at {spec.logit_softcap:g} (final_logit_softcapping): its tanh keeps one "
                f"more tensor over the vocabulary, which the {self.stack} stack does not make; --stack hf counts it")
        return tuple(caveats)

    def _splits(self) -> str:
        """The tensor and pipeline splits asked for, as a sentence names them: "tp 2 is", "tp 2 and pp 4 are"."""
        asked = [f"{axis} {n}" for axis, n in (("tp", self.layout.tp), ("pp", self.layout.pp)) if n > 1]
        return " and ".join(asked) + (" are" if len(asked) > 1 else " is")

    def sdpa_masked(self, spec: ModelSpec) -> bool:
        """Does transformers (the stack's modules) hand some layer's SDPA an explicit mask (ModelSpec.sdpa_mask;
        the first layer is a sliding-window one if any is)? Under ``flash`` attention, not a soft-capped model's:
        its flash attention is FlashAttention 2, which takes the window itself."""
        return (get_stack(self.stack).transformers_modules and self.attention == "flash"
                and not spec.attention_softcap and spec.sdpa_mask(self.seq_len, 0))

    @property
    def cp_comm(self) -> str:
        """How context-parallel ranks exchange keys and values (`cp_comm`)."""
        return cp_comm(self.layout, self.stack)

    def stage_layers(self, spec: ModelSpec) -> tuple[int, ...]:
        """Blocks on each pipeline stage, given or the stack's split (headroom.core.specs.stages)."""
        return stage_layers(self.layout, spec.n_layers, self.stack)

    def recomputed_blocks(self, layers: int) -> int:
        """Blocks of a pipeline stage of ``layers`` whose forward the policy runs again whole: all of them under
        full and every-K; under block-K the first K of each of the stage's chunks, its blocks split over the
        layout's virtual stages as evenly as they go (headroom.core.specs.recompute.RecomputePolicy.recomputed_layers)."""
        policy = self.recompute
        if policy.kind != "block":
            return policy.recomputed_layers(layers)
        v = self.layout.virtual_stages if self.layout.pp > 1 else 1
        return sum(policy.recomputed_layers(layers // v + (i < layers % v)) for i in range(v))

    def chunk_layers(self, spec: ModelSpec) -> tuple[int, ...]:
        """Blocks in each pipeline chunk (virtual stage), first to last (headroom.core.specs.stages)."""
        return chunk_layers(self.layout, spec.n_layers, self.stack)

    @property
    def ep_comm(self) -> str:
        """How expert-parallel ranks exchange tokens: the layout's setting, else an all-to-all (every stack's
        default)."""
        return self.layout.ep_comm or "all-to-all"

    def _check_ep_comm(self, stack: Stack, spec: ModelSpec) -> None:
        """DeepEP and HybridEP run under the stacks that offer them (Stack.hierarchical_dispatch), dropless."""
        comm = self.layout.ep_comm
        if comm not in HIERARCHICAL:
            return
        offering = [s.name for s in STACKS.values() if s.hierarchical_dispatch]
        if not stack.hierarchical_dispatch:
            raise ConfigError(f"--stack {stack.name} --ep-comm {comm}: only {' and '.join(offering)} dispatch tokens "
                              "by DeepEP or HybridEP; use --ep-comm all-to-all, or --stack " + " or ".join(offering))
        if spec.capacity_factor:
            raise ConfigError(f"{spec.name}: --ep-comm {comm} with capacity factor {spec.capacity_factor:g}: its "
                              "dispatch is dropless (Megatron-LM refuses --moe-pad-expert-input-to-capacity with the "
                              "flex dispatcher's DeepEP backend); leave the capacity factor out, or use --ep-comm "
                              "all-to-all")

    def _check_ep_overlap(self, stack: Stack) -> None:
        """What Megatron-LM asserts of --overlap-moe-expert-parallel-comm (TransformerConfig.__post_init__)."""
        if not stack.overlaps_expert_parallel:
            raise ConfigError(f"--stack {stack.name} --ep-overlap on: only megatron "
                              "(--overlap-moe-expert-parallel-comm) runs one micro-batch's expert all-to-alls beside "
                              "another's compute; use --ep-overlap off, or --stack megatron")
        if self.recompute.recomputes_blocks:
            raise ConfigError(f"--ep-overlap on with {self.recompute} recompute: Megatron-LM refuses full, every-K and "
                              "block-K recomputation (granularity full) with --overlap-moe-expert-parallel-comm; use "
                              "none, selective or offload")
        if self.recipe.compute_dtype not in ("bf16", "fp16"):
            raise ConfigError(f"--ep-overlap on with {self.precision}: Megatron-LM overlaps the expert all-to-alls of "
                              "a 16-bit model only; use a bf16 recipe")

    def check_model(self, spec: ModelSpec) -> None:
        """Reject combinations the model cannot run, or cannot split by the layout."""
        if self.compile and (spec.block != "llama" or spec.is_moe or spec.is_mla or spec.qk_norm or spec.bias != "none"):
            raise ConfigError(f"{spec.name}: --compile on is measured for llama blocks (RMSNorm, RoPE, SwiGLU, no "
                              "biases, q/k norms or experts); use --compile off")
        if self.float8 is not None and (spec.is_moe or spec.is_mla):
            kind = "a mixture of experts" if spec.is_moe else "latent attention"
            raise ConfigError(f"{spec.name}: --fp8 {self.fp8} of {kind} is not modelled (grouped experts' fp8 GEMMs "
                              "are converted apart, by converters of their own); use --fp8 off")
        tp = self.layout.tp
        if self.float8 is not None and (misfits := te_misfits(self.float8, {
                "hidden": spec.hidden, "query width / tp": spec.q_dim // tp, "ffn_hidden / tp": spec.ffn_hidden // tp},
                self.rank_tokens // tp if self.layout.sp else self.rank_tokens)):
            verb = "does" if len(misfits) == 1 else "do"
            width_unit, rows_unit = te_units(self.float8)
            check = "MXFP8Quantizer.is_quantizable" if self.float8.block else "assert_dim_for_fp8_exec"
            raise ConfigError(f"{spec.name}: --fp8 {self.fp8}: Transformer Engine's fp8 GEMMs need each linear's "
                              f"input width to divide by {width_unit} and its rows by {rows_unit}, and its "
                              f"{', '.join(misfits)} {verb} not ({check}); use --fp8 off, or another micro-batch or "
                              "seq-len")
        if self.float8 is not None and (misfits := mx_misfits(self.float8, {
                "hidden": spec.hidden, "query width": spec.q_dim, "key/value width": spec.kv_dim,
                "ffn_hidden": spec.ffn_hidden, "vocabulary": spec.vocab_size})):
            verb = "does" if len(misfits) == 1 else "do"
            raise ConfigError(f"{spec.name}: --fp8 {self.fp8} casts every linear in blocks of {self.float8.block} "
                              f"along each width, and its {', '.join(misfits)} {verb} not divide by that (torchao "
                              "asserts they do); use --fp8 torchao-rowwise")
        if spec.is_mla and (self.layout.tp > 1 or self.layout.pp > 1):
            raise ConfigError(f"{spec.name}: latent attention is planned on data and context parallelism with "
                              f"sharding; {self._splits()} not modelled for it yet: use tp 1 and pp 1")
        stack = get_stack(self.stack)
        if stack.transformers_modules and not hf_stack_covers(spec, stack.name):
            covered = "llama, mistral, qwen2, qwen3" + (", gemma, gemma2, gemma3" if stack.name == "hf" else "")
            raise ConfigError(f"{spec.name}: the {stack.name} stack accounts for transformers' Llama modules "
                              f"({covered}); for this architecture, trace transformers' own model with "
                              "`headroom estimate --model CONFIG --trace`, or plan with --stack reference")
        if spec.attention_softcap and stack.transformers_modules and self.attention == "flash" \
                and get_precision(self.precision).compute_dtype == "fp32":
            raise ConfigError(f"{spec.name}: its soft-capped attention runs on FlashAttention 2 under transformers, "
                              f"which takes 16-bit inputs only, not --precision {self.precision}'s fp32: use "
                              "--attention standard (eager) or a bf16 recipe (amp-bf16, bf16-pure, bf16-master)")
        if self.layout.cp > 1 and self.sdpa_masked(spec):
            shorter = f", or a seq-len under {spec.sliding_window:,}" if spec.sliding_window else ""
            raise ConfigError(f"{spec.name}: at seq-len {self.seq_len:,} transformers hands the SDPA of its "
                              "sliding-window layers an explicit mask, which ring attention (cp "
                              f"{self.layout.cp}) cannot take: use cp 1{shorter}")
        if not stack.tensor_parallel and self.layout.tp > 1:
            raise ConfigError(f"--stack {stack.name} --tp {self.layout.tp}: Liger's fused linear cross-entropy needs the "
                              "head's whole vocabulary on each rank; use tp 1 (data parallelism and sharding), or "
                              "--stack hf")
        if not stack.pipeline_parallel and self.layout.pp > 1:
            raise ConfigError(f"--stack {stack.name} --pp {self.layout.pp}: the HF Trainer has no pipeline schedule "
                              "(transformers' own pipeline only sends hidden states forward, for inference); use pp 1 "
                              "with sharding (zero 3), or --stack torchtitan or megatron for a pipeline")
        if self.layout.schedule == "zbv" and self.layout.pp > 1 and stack.zero_bubble is None:
            raise ConfigError(f"--stack {stack.name} --schedule zbv: the zero-bubble ZB-V schedule is torch's "
                              "ScheduleZBVZeroBubble, run by torchtitan (ZBVZeroBubble) and the reference stack; "
                              f"{stack.name} has no zero-bubble schedule: use --schedule 1f1b or interleaved, or "
                              "--stack torchtitan")
        if self.layout.ep_overlap:
            self._check_ep_overlap(stack)
        self._check_ep_comm(stack, spec)
        if self.layout.tp_overlap and not stack.overlaps_tensor_parallel:
            raise ConfigError(f"--stack {stack.name} --tp-overlap on: only megatron (--tp-comm-overlap) and torchtitan "
                              "(async tensor parallelism) run tensor-parallel collectives beside the GEMMs; use "
                              "--tp-overlap off, or one of those stacks")
        if not stack.sequence_parallel and self.layout.sp:
            raise ConfigError(f"--stack {stack.name} --sp on: transformers' tensor parallelism replicates the norms "
                              "and the residual stream (its DistributedConfig's enable_sequence_parallel is not wired "
                              "up); use --sp off")
        if (why := self.unmodelled_policy(spec, self.recompute)) is not None:
            raise ConfigError(f"{why}; use full or none")
        if spec.is_moe and (self.layout.tp > 1 or self.layout.pp > 1):
            raise ConfigError(
                f"{spec.name}: a mixture of experts ({spec.n_experts} experts, {spec.experts_per_token} per token) is "
                f"planned on data, context and expert parallelism with sharding; {self._splits()} not modelled for "
                "it yet: use tp 1 and pp 1")
        if self.layout.ep > 1 and not spec.is_moe:
            raise ConfigError(f"{spec.name}: ep {self.layout.ep} splits a mixture of experts' routed experts over "
                              "ranks, and this model has none: use ep 1")
        if self.layout.ep > 1 and spec.n_experts % self.layout.ep:
            raise ConfigError(f"{spec.name}: its {spec.n_experts} routed experts do not split over ep "
                              f"{self.layout.ep}; use --ep among {divisors_near(spec.n_experts, self.layout.ep)}")
        self.layout.check_model(spec.name, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, seq_len=self.seq_len)
        try:
            self.stage_layers(spec)
        except ConfigError as e:
            raise ConfigError(f"{spec.name}: {e}") from None
        if spec.block == "llama" and self.dropout > 0:
            raise ConfigError(f"{spec.name}: llama blocks have no dropout; use --dropout 0")
        if not spec.rotary and self.seq_len > spec.max_seq_len:
            raise ConfigError(
                f"{spec.name}: seq-len {self.seq_len} exceeds its {spec.max_seq_len} learned positions"
            )

        if self.recompute.kind in ("every", "block") and self.recompute.every > spec.n_layers:
            kind = self.recompute.kind
            raise ConfigError(
                f"{spec.name}: {self.recompute} is longer than the model's {spec.n_layers} layers; "
                f"use {kind}-K with K <= {spec.n_layers}"
            )
