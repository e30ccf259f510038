"""The model's forward on one rank, replayed block by block: the embedding, each block's attention and MLP (or
experts) under the checkpoint policy, the final norm, the head and the loss (core/memory/trace.py's vocabulary)."""

from __future__ import annotations

import functools
from dataclasses import replace

from headroom.core.memory.attention_trace import (
    attention_core,
    eager_mask,
    latent_qkv,
    local_rope,
    rotary,
    sdpa_masked_layer,
    shared_tables,
)
from headroom.core.memory.pipeline import RankKind
from headroom.core.memory.trace import Dims, Sym, Trace, per_head, storage_view
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import DeviceRules
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.stack import get_stack

CPU_RNG_STATE_BYTES = 5056
"""``torch.get_rng_state()``, the CPU generator's state: a compiled checkpoint (torch.compile over
``torch.utils.checkpoint``) keeps it for backward as a saved tensor, once a checkpointed region, where an eager
checkpoint holds it outside autograd. Measured on the CPU, with the block compiled in training (compiled under the
probe's own saved-tensor hooks, it keeps none); what a GPU's compiled checkpoint keeps of its generators is not
measured yet."""


def new_trace(spec: ModelSpec, cfg: TrainConfig, rules: DeviceRules, layer: int | None = None) -> Trace:
    """An empty trace for ``cfg`` on a device with ``rules``: autocast or not, the stack's kernels, and ``layer``
    the block it starts in (None: the model's own tensors)."""
    return Trace(rules=rules, amp=cfg.runs_autocast, layer=layer, stack=get_stack(cfg.stack),
                  norm_offset=spec.norm_offset, float8=cfg.float8, compiled=cfg.compile)


def trace_forward(spec: ModelSpec, cfg: TrainConfig, rules: DeviceRules, rank: RankKind) -> Trace:
    """One micro-batch's forward on a rank of kind ``rank``: its embedding (first stage) or received input, its
    blocks segment by segment under the checkpoint policy, and on the last stage the final norm, head and loss."""
    param_dtype = cfg.block_param_dtype
    tr = new_trace(spec, cfg, rules)
    d = Dims.of(spec, cfg)
    b, h = d.b, d.h

    if rank.first:
        x = trace_embedding(tr, spec, cfg, d, param_dtype)
    else:  # the previous stage's output, received
        x = tr.new("stage_input", (b, d.rows, h), param_dtype)

    bf16 = _bf16_layers(cfg, rank)
    for part, start, end in _policy_ranges(cfg, rank.chunk_layers):
        x = _blocks(tr, spec, d, part, x, param_dtype, start, end, rank.layers, bf16)
    tr.layer = None
    if rank.last:
        trace_head(tr, spec, cfg, d, x, param_dtype)
    return tr


def _policy_ranges(cfg: TrainConfig, chunks: tuple[int, ...]) -> list[tuple[TrainConfig, int, int]]:
    """The rank's blocks (``chunks``: each chunk's, in the order the rank runs them) as ranges under one policy
    each: all of them under the configuration's own, but under block-K each chunk's first min(K, n) checkpointed
    one by one (as under full) and the rest kept whole (as under none), as Megatron-LM's ``TransformerBlock`` runs
    each chunk."""
    policy = cfg.recompute
    if policy.kind != "block":
        return [(cfg, 0, sum(chunks))]
    full, none = replace(cfg, recompute=RecomputePolicy("full")), replace(cfg, recompute=RecomputePolicy("none"))
    ranges, start = [], 0
    for n in chunks:
        k = policy.recomputed_layers(n)
        ranges += [(full, start, start + k)] + ([(none, start + k, start + n)] if k < n else [])
        start += n
    return ranges


def _blocks(tr: Trace, spec: ModelSpec, d: Dims, cfg: TrainConfig, x: Sym, param_dtype: str, first: int, last: int,
            n: int, bf16: frozenset[int]) -> Sym:
    """Blocks ``first``..``last - 1`` of the rank's ``n``, segment by segment under ``cfg``'s policy."""
    if first >= last:  # none (a rank's embedding alone, under zbv)
        return x
    policy = cfg.recompute
    size = policy.segment_layers(n) if policy.recomputes_blocks else 1
    # A segment saves what an earlier one of the same length and kinds of layer saved (headroom.core.memory.trace.Repeat):
    # replayed instead of traced, an 80-layer model costs two segments. The first segment, and any that made a
    # tensor the model makes once (a RoPE table, a mask), are no template.
    templates: dict[tuple, int] = {}
    run: list[int] = []  # the segments replayed in a row from one template: template, first start, count
    starts = range(first, last, size)
    i = 0
    while i < len(starts):
        index, start = i, starts[i]
        end = min(start + size, last)
        kinds = _segment_kinds(tr, spec, start, end, bf16)
        if (template := templates.get(kinds)) is not None and run and run[0] == template:
            alike = _alike_from(tr, spec, start, size, last, bf16)  # a 10,000-layer rank replays its run in one step
            run[2] += alike
            i += alike
            continue
        i += 1
        if run:
            x = tr.repeat_segments(*run, size, x)
            run = []
        if template is not None:
            run = [template, start, 1]
            continue
        shared = len(tr.shared)
        x = _segment(tr, spec, d, cfg, x, param_dtype, start, end, bf16)
        if index and len(tr.shared) == shared:
            templates[kinds] = start
    if run:
        x = tr.repeat_segments(*run, size, x)
    return x


def trace_embedding(tr: Trace, spec: ModelSpec, cfg: TrainConfig, d: Dims, param_dtype: str) -> Sym:
    """The first stage's embedding: token ids looked up, learned positions added (gpt), transformers' scaling,
    dropout; returns the residual stream the first block reads."""
    b, h = d.b, d.h
    tokens = tr.new("tokens", (b, d.s), "int64", "input")
    tr.save(tokens)  # the embedding's backward needs the indices
    x = tr.new("embed", (b, d.rows, h), param_dtype)
    if not spec.rotary:
        tr.save(tr.new("positions", (d.s,), "int64"))
        tr.new("embed_positions", (d.s, h), param_dtype)  # the position table looked up, then added
        x = tr.new("embed_sum", (b, d.rows, h), param_dtype, reads=2)
    if spec.scaled_embedding and tr.stack.transformers_modules:  # times sqrt(h): the product keeps the scalar
        tr.save(tr.new("embed_scale", (), param_dtype, "input"))
        x = tr.new("embed_scaled", (b, d.rows, h), param_dtype)
    if cfg.dropout > 0:
        x = tr.dropout(x, "embed_dropout")
    return x


def trace_head(tr: Trace, spec: ModelSpec, cfg: TrainConfig, d: Dims, x: Sym, param_dtype: str) -> None:
    """The last stage's tail: the final norm, the head and the loss, reading the blocks' output ``x``."""
    h = d.h
    final = (tr.layer_norm if spec.block == "gpt" else tr.rms_norm)(x, "final_norm", param_dtype)
    loss = tr.stack.loss_at(cfg.layout.tp)
    if loss == "fused-linear":
        # Liger's fused head and loss computes both gradients in forward and keeps them, not the logits (headroom.core.specs.stack).
        grad_input, grad_weight = tr.new("loss.grad_input", (d.tokens, h), final.dtype), \
            tr.new("loss.grad_weight", (d.vocab, h), param_dtype)
        # Its forward runs the head's three products (logits and both gradients), chunk by chunk: priced as the
        # head's one forward product, whose backward (headroom.core.timing.step_ops) is the other two.
        tr.as_gemm(grad_input, d.tokens, d.vocab, h, dtype="bf16" if tr.amp else final.dtype)
        tr.unrecord(grad_weight)
        tr.save(grad_input, grad_weight)
        return
    final, kept = _column_input(tr, d, final, "final_norm")
    logits = tr.linear(final, "lm_head", d.vocab, param_dtype, kept)
    if d.loss_vocab != d.vocab:  # all-gathered over the tensor-parallel ranks (Stack.gathers_logits)
        logits = tr.new("logits_gathered", (*logits.shape[:-1], d.loss_vocab), logits.dtype)
    if spec.logit_softcap and tr.stack.transformers_modules:  # cap x tanh(logits / cap): tanh keeps its output
        tr.save(tr.new("lm_head.softcap_tanh", logits.shape, logits.dtype))
        logits = tr.new("logits_capped", logits.shape, logits.dtype)
    tr.cast(logits, "fp32", "logits_fp32")  # .float() for the loss: not saved
    if loss == "vocab-parallel":
        # Megatron's cross-entropy keeps its fp32 copy of the logits, turned into the softmax in place, a target
        # mask and the targets; its training script's loss_func keeps the fp32 loss mask (headroom.core.specs.stack).
        tr.save(
            tr.new("loss.softmax", (d.tokens, d.loss_vocab), "fp32"),
            tr.new("loss.target_mask", (d.tokens,), "bool"),
            tr.new("loss.masked_target", (d.tokens,), "int64"),
            tr.new("loss.mask", (d.tokens,), "fp32", "input"),
        )
        return
    tr.save(
        tr.new("log_softmax", (d.tokens, d.loss_vocab), "fp32"),
        _targets(tr, d),
        tr.new("loss.total_weight", (), "fp32") if loss == "log-softmax" else None,  # nll_loss's
    )


def _targets(tr: Trace, d: Dims) -> Sym:
    """The token ids the loss keeps. transformers' loss pads the labels by one and shifts them: ``.contiguous()``
    copies the shifted rows, except for one sequence, whose shift is a view of the padded (1, s + 1) ids."""
    if tr.stack.transformers_modules and d.b == 1:
        return storage_view(tr.new("targets_padded", (1, d.s + 1), "int64", "input"), (d.tokens,))
    return tr.new("targets", (d.tokens,), "int64", "input")


def _bf16_layers(cfg: TrainConfig, rank: RankKind) -> frozenset[int]:
    """The rank's blocks, by index on the rank, that run in bf16 under the FP8 recipe (TrainConfig.first_last_bf16):
    the model's first on the first stage, its last on the last."""
    n = rank.layers
    ends = [*range(cfg.bf16_blocks(n, rank.first, False)), *range(n - cfg.bf16_blocks(n, False, rank.last), n)]
    return frozenset(ends)


def _traced_block(tr: Trace, spec: ModelSpec, d: Dims, cfg: TrainConfig, x: Sym, param_dtype: str, layer: int,
                  bf16: frozenset[int]) -> Sym:
    """Block ``layer``, under the FP8 recipe or, where it is one of ``bf16``, without it."""
    tr.layer = layer
    tr.float8 = None if layer in bf16 else cfg.float8
    try:
        return trace_block(tr, spec, d, cfg, x, param_dtype)
    finally:
        tr.float8 = cfg.float8


def _segment(tr: Trace, spec: ModelSpec, d: Dims, cfg: TrainConfig, x: Sym, param_dtype: str,
             start: int, end: int, bf16: frozenset[int] = frozenset()) -> Sym:
    """Blocks start..end-1 under the policy: one checkpointed region, or plain (offloaded) blocks."""
    policy = cfg.recompute
    tr.layer = start
    if policy.recomputes_blocks or policy.caches_matmuls:
        if tr.stack.rope == "shared" and spec.rotary:
            # transformers hands each checkpointed layer cos, sin and the positions: kept once, as the model's.
            for layer in range(start, end):
                tr.keep_outside(*shared_tables(tr, d, spec.rotary_dim, x.dtype, local_rope(spec, layer)))
            tr.keep_outside(tr.once("positions", (d.s,), "int64"))
        if tr.stack.transformers_modules and cfg.attention == "standard":
            # and its eager attention the additive mask of the layer's kind, made once per forward
            tr.keep_outside(*(eager_mask(tr, spec, d, layer, x.dtype) for layer in range(start, end)))
        elif tr.stack.transformers_modules:
            # SDPA a sliding-window layer's boolean mask, where it is explicit: one (s, s) expanded over the batch
            tr.keep_outside(*(tr.once("attention_mask.sliding_sdpa", (1, 1, d.s, d.s), "bool")
                              for layer in range(start, end) if sdpa_masked_layer(spec, cfg, layer)))
        if tr.compiled:  # the compiled checkpoint keeps the CPU generator's state as a saved tensor
            tr.save(tr.new("checkpoint.rng_state", (CPU_RNG_STATE_BYTES,), "uint8", "input"))
        with tr.checkpointed(x, kind="op-selective" if policy.caches_matmuls else "checkpoint"):
            if not policy.caches_matmuls:
                # A checkpointed region keeps nothing but its input: its blocks need not be traced (most of a
                # layout search's traces), only their output made, as the last block's residual add makes it.
                tr.layer = end - 1
                return tr.new("residual_mlp", x.shape, x.dtype)
            for layer in range(start, end):
                x = _traced_block(tr, spec, d, cfg, x, param_dtype, layer, bf16)
        return x
    tr.offloading = policy.offloads
    for layer in range(start, end):
        x = _traced_block(tr, spec, d, cfg, x, param_dtype, layer, bf16)
    tr.offloading = False
    return x


def _alike_from(tr: Trace, spec: ModelSpec, start: int, size: int, n: int, bf16: frozenset[int] = frozenset()) -> int:
    """Segments from ``start`` on, before block ``n``, in a row whose kinds (`_segment_kinds`) are the one at
    ``start``'s: every full segment past the dense blocks of a mixture of experts, when a window's pattern repeats
    within a segment's length (or there is none), up to the first that holds a bf16 block (`_bf16_layers`); else
    this one."""
    windowed = tr.stack.transformers_modules and spec.sliding_window_pattern > 1
    if start + size > n or (spec.is_moe and start < spec.dense_layers) \
            or (windowed and size % spec.sliding_window_pattern) or any(start <= layer < start + size for layer in bf16):
        return 1
    end = min([layer for layer in bf16 if layer >= start], default=n)
    return (min(end, n) - start) // size or 1


def _segment_kinds(tr: Trace, spec: ModelSpec, start: int, end: int, bf16: frozenset[int] = frozenset()) -> tuple:
    """What a segment of blocks keeps depends on: its length, and each block's kind, where blocks differ:
    experts in place of the MLP, under transformers' modules a sliding window (its mask, its RoPE tables), and a
    block kept out of the FP8 recipe (`_bf16_layers`)."""
    windowed = tr.stack.transformers_modules and spec.sliding_window_pattern > 1
    if not (spec.is_moe or windowed or bf16):
        return (end - start,)
    return (end - start, *((spec.is_moe_layer(n), windowed and spec.sliding(n), n in bf16) for n in range(start, end)))


def trace_block(tr: Trace, spec: ModelSpec, d: Dims, cfg: TrainConfig, x: Sym, param_dtype: str) -> Sym:
    b, rows, h = d.b, d.rows, d.h
    gpt = spec.block == "gpt"
    norm = tr.layer_norm if gpt else tr.rms_norm

    a, kept = _column_input(tr, d, norm(x, "attn_norm", param_dtype), "attn_norm")
    tr.mm_count = 0  # a checkpointed block counts its own matmuls (torchtitan's SAC)
    qkv_bias, other_bias = spec.bias in ("qkv", "all"), spec.bias == "all"
    if spec.is_mla:
        q, k, v = latent_qkv(tr, spec, d, a, param_dtype)
        attention = functools.partial(attention_core, v_head_dim=spec.v_head_size, qk_contiguous=True)
    else:
        q, k, v = _qkv(tr, d, a, param_dtype, kept, qkv_bias)
        if spec.qk_norm:  # over each head: the projection's output seen as (b, s, heads, head_dim)
            q = tr.rms_norm(per_head(q, d.heads, d.head_dim), "attn.q_norm", param_dtype)
            k = tr.rms_norm(per_head(k, d.kv_heads, d.head_dim), "attn.k_norm", param_dtype)
        if spec.rotary:
            q, k = rotary(tr, d, q, k, spec.rotary_dim, x.dtype, local_rope(spec, tr.layer))
        attention = attention_core
    capped, masked = bool(spec.attention_softcap), sdpa_masked_layer(spec, cfg, tr.layer)
    tr.attention_core = True  # what selective checkpointing reruns (headroom.core.timing.step_ops tags its ops)
    if cfg.recompute.recomputes_attention:
        with tr.checkpointed(q, k, v):
            y = attention(tr, d, cfg, q, k, v, capped=capped, masked=masked)
    else:
        y = attention(tr, d, cfg, q, k, v, capped=capped, masked=masked)
    tr.attention_core = False
    o = tr.linear(y, "attn.o_proj", h, param_dtype, rows=rows, bias=other_bias)
    if spec.post_norms:
        o = norm(o, "attn_post_norm", param_dtype)
    if cfg.dropout > 0:
        o = tr.dropout(o, "attn.resid_dropout")
    if not spec.parallel_residual:  # else the MLP reads the block's input too
        x = tr.new("residual_attn", (b, rows, h), x.dtype, reads=2)

    m, kept = _column_input(tr, d, norm(x, "mlp_norm", param_dtype), "mlp_norm")
    if spec.is_moe_layer(tr.layer or 0):
        down = _experts(tr, spec, d, m, param_dtype, cfg.layout.ep)
    elif gpt:
        up = tr.linear(m, "mlp.up_proj", d.ffn, param_dtype, kept, bias=other_bias)
        tr.save(up)  # GELU saves its input
        hidden = tr.new("mlp.gelu", up.shape, up.dtype)
        down = tr.linear(hidden, "mlp.down_proj", h, param_dtype, rows=rows, bias=other_bias)
    else:
        down = _swiglu(tr, m, "mlp", d.ffn, h, param_dtype, kept, rows, bias=other_bias)
    if spec.post_norms:
        down = norm(down, "mlp_post_norm", param_dtype)
    if cfg.dropout > 0:
        down = tr.dropout(down, "mlp.resid_dropout")
    return tr.new("residual_mlp", (b, rows, h), x.dtype, reads=2)


def _column_input(tr: Trace, d: Dims, x: Sym, name: str) -> tuple[Sym, Sym | None]:
    """What a column-parallel linear reads, and what its backward keeps instead when that differs.

    Without sequence parallelism: x itself. With it, x is all-gathered over the sequence first;
    ``torch`` keeps the gathered tensor, ``megatron`` keeps x and gathers again in backward.
    """
    if not d.sp:
        return x, None
    gathered = tr.new(f"{name}.gathered", (d.b, d.s, x.shape[-1]), x.dtype)
    return gathered, None if d.keep_gathered else x


def _qkv(tr: Trace, d: Dims, a: Sym, param_dtype: str, kept: Sym | None, bias: bool) -> tuple[Sym, Sym, Sym]:
    """q, k and v from three linears, or (torchtitan's ``wqkv``) from one whose output is copied out as three
    contiguous tensors: one matmul, one input cast under autocast, and no copy kept."""
    if not tr.stack.fused_qkv:
        return (tr.linear(a, "attn.q_proj", d.q, param_dtype, kept, bias=bias),
                tr.linear(a, "attn.k_proj", d.kv, param_dtype, kept, bias=bias),
                tr.linear(a, "attn.v_proj", d.kv, param_dtype, kept, bias=bias))
    qkv = tr.linear(a, "attn.qkv_proj", d.q + 2 * d.kv, param_dtype, kept, bias=bias)
    return tuple(tr.new(f"attn.{name}", (*qkv.shape[:-1], width), qkv.dtype)
                 for name, width in (("q", d.q), ("k", d.kv), ("v", d.kv)))


def _swiglu(tr: Trace, x: Sym, name: str, width: int, out: int, param_dtype: str, kept: Sym | None = None,
            rows: int | None = None, stacked: int = 1, bias: bool = False) -> Sym:
    """down(silu(gate(x)) * up(x)): what a gated MLP keeps; returns the down projection's output.

    ``kept``, ``rows`` and ``bias`` as for ``Trace.linear``; ``stacked``: x holds the rows of that many
    experts, each with its own weights. What the product keeps is the stack's (headroom.core.specs.stack.Swiglu): Megatron's
    fused kernel reads gate and up as one fc1 output and keeps only that, Liger's keeps gate and up, and both
    recompute SiLU in backward."""
    if tr.stack.swiglu == "fc1":
        fc1 = tr.linear(x, f"{name}.fc1", 2 * width, param_dtype, kept, stacked=stacked, bias=bias)
        tr.save(fc1)
        hidden = tr.new(f"{name}.swiglu", (*fc1.shape[:-1], width), fc1.dtype, reads=2)
        return tr.linear(hidden, f"{name}.down_proj", out, param_dtype, rows=rows, stacked=stacked, bias=bias)
    gate = tr.linear(x, f"{name}.gate_proj", width, param_dtype, kept, stacked=stacked, bias=bias)
    up = tr.linear(x, f"{name}.up_proj", width, param_dtype, kept, stacked=stacked, bias=bias)
    if tr.stack.swiglu == "silu-mul" or tr.in_compiled:  # SiLU recomputed in backward
        tr.save(gate, up)
    else:
        tr.save(gate)  # SiLU saves its input
        silu = tr.new(f"{name}.silu", gate.shape, gate.dtype)
        tr.save(silu, up)  # the product saves both factors
    hidden = tr.new(f"{name}.swiglu", gate.shape, gate.dtype, reads=2)
    return tr.linear(hidden, f"{name}.down_proj", out, param_dtype, rows=rows, stacked=stacked, bias=bias)


def _experts(tr: Trace, spec: ModelSpec, d: Dims, x: Sym, param_dtype: str, ep: int = 1) -> Sym:
    """A mixture-of-experts MLP, dropless (headroom.agent.model.Experts), over this rank's t tokens.

    Router: its input (cast per call under autocast) and logits, fp32 softmax probabilities, top-k
    indices (and, renormalised, the top-k weights and their sum). Each expert runs on the tokens routed
    to it, t x k rows over all experts however the router spreads them, so the experts' tensors are
    written as one of t x k rows: the (token, slot) pairs torch.where finds, each expert's SwiGLU
    tensors, its output and routing weight (their product keeps both) and the weighted output, which
    index_add keeps, in the residual stream's dtype. Every expert's weight is copied under autocast,
    chosen or not. Then the shared expert over every token, and the product with its sigmoid gate.

    Under expert parallelism (``ep``) the rank's experts are its n_experts / ep, and they run on the
    rows the all-to-all brings them: t x k on average, as many as the rank sends away, so the tensors
    keep their sizes (balanced routing; a skewed router loads some ranks more) and only the weight
    copies shrink. At a capacity factor every expert runs on its capacity of rows, dropped tokens
    gone and the rest padded (headroom.agent.model.Experts): E x capacity rows in place of t x k.
    """
    t, h, k = d.b * d.rows, d.h, spec.experts_per_token
    routed = spec.expert_rows(t)
    flat = Sym(x.storage, (t, h), x.dtype, x.name, x.kind)  # a view: (b, s, h) as (t, h)
    tr.linear(flat, "moe.router", spec.n_experts, param_dtype)
    tr.save(tr.new("moe.router_probs", (t, spec.n_experts), "fp32"), tr.new("moe.topk_indices", (t, k), "int64"))
    if spec.normalize_expert_weights:  # the division keeps numerator and denominator
        tr.save(tr.new("moe.topk_weights", (t, k), "fp32"), tr.new("moe.topk_weight_sum", (t, 1), "fp32"))
    tr.save(tr.new("moe.token_slots", (routed, 2), "int64"))
    # The gathered rows are not kept themselves: each linear keeps them, or under autocast its own cast.
    permuted = tr.new("moe.permuted_tokens", (routed, h), x.dtype)
    out = _swiglu(tr, permuted, "moe.experts", spec.expert_ffn, h, param_dtype, stacked=spec.n_experts // ep)
    weights = tr.new("moe.routing_weights", (routed, 1), "fp32")
    tr.save(out, weights)  # the product keeps both factors
    weighted = tr.cast(tr.new("moe.weighted", (routed, h), "fp32"), x.dtype, "moe.weighted_cast")
    tr.save(weighted)  # index_add keeps its source
    result = tr.new("moe.combined", (t, h), x.dtype)
    if spec.shared_expert_ffn_hidden:
        shared = _swiglu(tr, flat, "moe.shared", spec.shared_expert_ffn_hidden, h, param_dtype)
        if spec.shared_expert_gate:
            logit = tr.linear(flat, "moe.shared_gate", 1, param_dtype)
            gate = tr.new("moe.shared_gate.sigmoid", logit.shape, logit.dtype)
            tr.save(gate, shared)  # sigmoid keeps its output; the product keeps both factors
        result = tr.new("moe.combined_shared", (t, h), x.dtype)
    return result
