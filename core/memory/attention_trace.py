"""The attention core and what it keeps: SDPA's fused and math paths, the explicit softmax(QK^T)V, RoPE,
multi-head latent attention's projections, and transformers' masks (core/memory/trace.py's vocabulary)."""

from __future__ import annotations

from headroom.core.memory.trace import Dims, Sym, Trace, storage_view
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.model import ModelSpec


def attention_core(tr: Trace, d: Dims, cfg: TrainConfig, q: Sym, k: Sym, v: Sym, v_head_dim: int | None = None,
                   qk_contiguous: bool = False, capped: bool = False, masked: bool = False) -> Sym:
    """The attention core over this rank's heads; returns the output-projection input (b, s, heads x v's head).

    ``v_head_dim``: value heads narrower than query and key heads (latent attention); ``qk_contiguous``: q and
    k come laid out (b, heads, s, d), so the explicit path's matmuls read them without a copy; ``capped``: the
    scores are soft-capped (ModelSpec.attention_softcap), which only transformers' eager attention does here;
    ``masked``: transformers hands SDPA an explicit mask (ModelSpec.sdpa_mask).

    Under transformers' SDPA, grouped k/v heads go to the kernel as they are (``enable_gqa``) unless a mask is
    given or heads are wider than 256, when ``repeat_kv`` copies them out (one shared head: a view). The fused
    kernel keeps the mask as SDPA makes it additive, (b, 1, s, s) in the inputs' dtype.

    The explicit path is the agent's decoder's, or under transformers' modules their eager attention: it adds
    its mask (keeping none), takes the softmax in fp32 whatever the inputs, and casts the probabilities back to
    the queries' dtype for the second matmul, which keeps that copy; a cap's tanh keeps its output."""
    b, s = d.b, d.s
    a, hd, groups = d.heads, d.head_dim, d.heads // d.kv_heads
    dv = v_head_dim or hd
    heads, v_heads = (b, a, s, hd), (b, a, s, dv)
    dropout = cfg.dropout > 0
    repeated = tr.stack.transformers_modules and groups > 1 and (masked or max(hd, dv) > 256)
    if tr.rules.fused_sdpa(cfg.attention, cfg.dropout, fp32=q.dtype == "fp32", grouped=groups > 1 and not repeated,
                           narrow_values=dv != hd, masked=masked):
        # q, k, v as given (grouped heads not expanded), output, fp32 log-sum-exp (and on CUDA the
        # dropout generator's seed and offset, kept with or without dropout).
        if repeated and d.kv_heads > 1:
            k, v = tr.new("attn.k_repeated", heads, k.dtype), tr.new("attn.v_repeated", v_heads, v.dtype)
        out = tr.matmul_output(tr.new("attn.sdpa_out", v_heads, q.dtype), "attention")
        lse = tr.matmul_output(tr.new("attn.logsumexp", (b, a, s), "fp32"), "attention")
        rng = [tr.matmul_output(tr.new(f"attn.philox_{n}", (), "int64"), "attention") for n in ("seed", "offset")
               ] if tr.rules.fused_attention_rng_state else []
        mask = tr.new("attn.sdpa_mask", (b, 1, s, s), q.dtype) if masked else None
        tr.as_attention(out, b * a, s, hd, dv, lse, *rng)
        tr.save(q, k, v, mask, out, lse, *rng)
        # Laid out (b, s, a, d): the output projection reads a view of the same storage.
        return Sym(out.storage, (b, s, a * dv), out.dtype, out.name)
    if cfg.attention == "flash":
        # SDPA's math path: upcasts 16-bit inputs, scales q and k, no mask tensor kept.
        acc = "fp32"
        # The causal mask, made additive (ones, tril, two scalars, where) and added to the scores below; q and k
        # each scaled, then made contiguous for the batched matmul.
        for part, shape in (("causal_ones", (s, s)), ("causal_tril", (s, s)), ("mask_zero", ()), ("mask_ninf", ()),
                            ("additive_mask", (s, s))):
            tr.new(f"attn.math.{part}", shape, acc)
        tr.new("attn.math.q_times_scale", heads, acc)
        tr.new("attn.math.k_times_scale", (b, a, hd, s), acc)
        q_b = tr.new("attn.math.q_scaled", heads, acc)
        k_b = tr.new("attn.math.k_scaled_t", (b, a, hd, s), acc)
        v_b = tr.new("attn.math.v_expanded" if groups > 1 else "attn.math.v", v_heads, acc)
        mask = None
        softmax_dtype = acc
        capped = False  # transformers never sends capped scores to SDPA
    else:
        # Explicit softmax(QK^T)V: bmm clones non-contiguous heads; repeat_interleave expands GQA.
        eager = tr.stack.transformers_modules
        q_b = q if qk_contiguous else tr.new("attn.q_heads", heads, q.dtype)
        k_b = k if qk_contiguous else tr.new("attn.k_expanded" if groups > 1 else "attn.k_heads_t",
                                             (b, a, hd, s) if groups == 1 else heads, k.dtype)
        v_b = tr.new("attn.v_expanded" if groups > 1 else "attn.v_heads", v_heads, v.dtype)
        if eager and groups > 1 and d.kv_heads == 1 and b == 1:
            # transformers' repeat_kv expands one k/v head as a view, which one sequence's matmuls read as it
            # is: they keep k and v themselves.
            k_b, v_b = k, v
        fused = tr.stack.fused_softmax
        if not eager and not fused:  # torch.ones(s, s).tril(), inverted for masked_fill: the inverse is what it keeps
            tr.new("attn.causal_ones", (s, s), "bool")
            tr.new("attn.causal_tril", (s, s), "bool")
        mask = None if eager else tr.new("attn.causal_mask", (s, s), "bool")
        if fused:
            tr.unrecord(mask)  # implied by the fused softmax's kernel, not made
        softmax_dtype = "fp32" if eager or (tr.amp and tr.rules.autocast_softmax_fp32) else q.dtype
        capped = capped and eager
    scores = tr.new("attn.scores", (b, a, s, s), q_b.dtype)
    tr.as_gemm(scores, s, s, hd, b * a)
    scores = tr.matmul_output(scores, "bmm")
    if not tr.stack.fused_softmax:  # scaled, then masked (masked_fill, or + a mask), then the softmax below
        if cfg.attention != "flash":  # SDPA's math path scaled q and k instead
            tr.new("attn.scores_scaled", scores.shape, scores.dtype)
        tr.new("attn.scores_masked", scores.shape, scores.dtype, reads=2)
    tr.save(q_b, k_b, mask)
    if capped:
        tr.save(tr.new("attn.softcap_tanh", scores.shape, scores.dtype))
    del scores  # not saved by the ops after it: only the softmax output is
    probs = tr.new("attn.softmax", (b, a, s, s), softmax_dtype)
    tr.save(probs)
    if dropout:
        probs = tr.dropout(probs, "attn.dropout")
    probs = tr.cast(probs, v_b.dtype, "attn.probs_cast")
    tr.save(probs, v_b)
    y = tr.new("attn.pv", v_heads, v_b.dtype)
    tr.as_gemm(y, s, dv, s, b * a)
    y = tr.matmul_output(y, "bmm")
    del y
    return tr.new("attn.out_heads_merged", (b, s, a * dv), q.dtype)


def rotary(tr: Trace, d: Dims, q: Sym, k: Sym, rotary_dim: int, dtype: str, local: bool = False
            ) -> tuple[Sym, Sym]:
    """q and k rotated, with what the stack's RoPE keeps (headroom.core.specs.stack): the reference's tables made in each
    layer and cast per call; Megatron's fused kernel one fp32 ``freqs`` table for the whole forward; transformers
    cos and sin made once in the residual stream's dtype ``dtype``, a pair of their own for ``local`` layers
    (ModelSpec.local_rope). Nothing else: the tables need no gradient."""
    if tr.stack.rope == "per-layer":
        # headroom.agent.model.rotary_tables: the inverse frequencies (arange, divided, base to their power, inverted), the
        # positions' outer product with them, doubled by a concatenation: small ops, none kept.
        half, rows = rotary_dim // 2, d.s
        for part, shape in (("arange", (half,)), ("exponents", (half,)), ("powers", (half,)),
                            ("reciprocal", (half,)), ("inv_freq", (half,)), ("positions", (rows,)),
                            ("angles", (rows, half)), ("angles_doubled", (rows, rotary_dim))):
            tr.new(f"rope.{part}", shape, "fp32")
        tables = (tr.new("rope.cos", (d.s, rotary_dim), "fp32"), tr.new("rope.sin", (d.s, rotary_dim), "fp32"))
        return _rope(tr, q, tables, "attn.q_rope"), _rope(tr, k, tables, "attn.k_rope")
    if tr.stack.rope == "shared-fp32":
        tr.save(tr.once("rope.freqs", (d.s, 1, 1, rotary_dim), "fp32"))
    else:
        tr.save(*shared_tables(tr, d, rotary_dim, dtype, local))
    return tr.new("attn.q_rope.rotated", q.shape, q.dtype), tr.new("attn.k_rope.rotated", k.shape, k.dtype)


def shared_tables(tr: Trace, d: Dims, rotary_dim: int, dtype: str, local: bool = False) -> tuple[Sym, Sym]:
    """transformers' cos and sin: (1, s, rotary_dim), one pair per forward (and kind of layer: ``local``)."""
    kind = "rope.local" if local else "rope"
    return tuple(tr.once(f"{kind}.{f}", (1, d.s, rotary_dim), dtype) for f in ("cos", "sin"))


def _rope(tr: Trace, x: Sym, tables: tuple[Sym, Sym], name: str) -> Sym:
    """x * cos + rotate_half(x) * sin: saves cos and sin, cast to x's dtype per call. Partial rotary
    rotates the first rotary_dim of each head and concatenates the rest back: the tables are that wide."""
    cos, sin = (tr.cast(t, x.dtype, f"{name}.{t.name.rsplit('.', 1)[-1]}_cast") for t in tables)
    if not tr.in_compiled:  # compiled, backward makes the tables again
        tr.save(cos, sin)
    # rotate_half's negated half and concatenation, and the two products: made and dropped, never kept.
    half = (*x.shape[:-1], x.shape[-1] // 2)
    for part, shape in (("negated", half), ("rotate_half", x.shape), ("x_cos", x.shape), ("rotated_sin", x.shape)):
        tr.new(f"{name}.{part}", shape, x.dtype)
    return tr.new(f"{name}.rotated", x.shape, x.dtype, reads=2)


def latent_qkv(tr: Trace, spec: ModelSpec, d: Dims, x: Sym, param_dtype: str) -> tuple[Sym, Sym, Sym]:
    """Multi-head latent attention's q, k and v (headroom.agent.model.LatentAttention, as transformers' DeepseekV3Attention).

    q from its latent (q_a, its norm, q_b) or one projection; kv_a projects to the key/value latent and one
    rotary key of rope_head_size, split from the same storage; the latent's norm and kv_b give each head's
    positionless key and its value, split again, so v is a view of kv_b's output (kept, it costs all of it).
    Rotary rotates q's and the shared key's last rope_head_size dimensions, and concatenation makes q and k
    (b, heads, s, head_size) anew: the attention's matmuls read them as they are.
    """
    b, s, a = d.b, d.s, d.heads
    dqk, dr, dv, rkv = spec.head_dim, spec.rope_head_size, spec.v_head_size, spec.kv_lora_rank
    if spec.q_lora_rank:
        latent_q = tr.linear(x, "attn.q_a_proj", spec.q_lora_rank, param_dtype)
        q = tr.linear(tr.rms_norm(latent_q, "attn.q_a_norm", param_dtype), "attn.q_b_proj", a * dqk, param_dtype)
    else:
        q = tr.linear(x, "attn.q_proj", a * dqk, param_dtype)
    kv = tr.linear(x, "attn.kv_a_proj", rkv + dr, param_dtype)
    normed = tr.rms_norm(storage_view(kv, (b, s, rkv)), "attn.kv_a_norm", param_dtype)
    kv_up = tr.linear(normed, "attn.kv_b_proj", a * (dqk - dr + dv), param_dtype)
    tables = (tr.new("rope.cos", (s, dr), "fp32"), tr.new("rope.sin", (s, dr), "fp32"))
    _rope(tr, storage_view(q, (b, a, s, dr)), tables, "attn.q_rope")
    k_rot = _rope(tr, storage_view(kv, (b, 1, s, dr)), tables, "attn.k_rope")
    q = tr.new("attn.q_cat", (b, a, s, dqk), q.dtype)  # cat keeps nothing for backward
    k = tr.new("attn.k_cat", (b, a, s, dqk), k_rot.dtype)
    return q, k, storage_view(kv_up, (b, a, s, dv))


def eager_mask(tr: Trace, spec: ModelSpec, d: Dims, layer: int, dtype: str) -> Sym:
    """The (b, 1, s, s) additive mask transformers' eager attention reads in ``layer``: one causal mask, or with
    sliding-window layers (ModelSpec.sliding_window_pattern) one for them too. Layers are counted from the
    rank's first: exact, as transformers' stacks have no pipeline (Stack.pipeline_parallel)."""
    kind = "sliding" if spec.sliding(layer) else "causal"
    return tr.once(f"attention_mask.{kind}", (d.b, 1, d.s, d.s), dtype)


def masked_sdpa_refusal(spec: ModelSpec, config: TrainConfig) -> str | None:
    """Why transformers' SDPA with an explicit mask cannot be counted on CUDA, where ``config`` hands it one."""
    if not config.sdpa_masked(spec):
        return None
    width = f" ({spec.sliding_window:,} tokens)" if spec.sliding_window else ""
    return (f"{spec.name}: at seq-len {config.seq_len:,}, transformers hands the SDPA of its sliding-window layers"
            f"{width} an explicit mask; which CUDA kernel takes it (memory-efficient attention or cuDNN), and what "
            "that keeps, has not been measured on a GPU yet: use --attention standard (transformers' eager "
            "attention, counted exactly)" + (f", or a seq-len under {spec.sliding_window:,}" if width else ""))


def local_rope(spec: ModelSpec, layer: int | None) -> bool:
    """Does ``layer`` rotate by the sliding-window layers' own RoPE tables (ModelSpec.local_rope)?"""
    return spec.local_rope and spec.sliding(layer or 0)


def sdpa_masked_layer(spec: ModelSpec, cfg: TrainConfig, layer: int | None) -> bool:
    """Does transformers hand ``layer``'s SDPA an explicit mask (TrainConfig.sdpa_masked, ModelSpec.sdpa_mask)?"""
    return cfg.sdpa_masked(spec) and spec.sdpa_mask(cfg.seq_len, layer or 0)
