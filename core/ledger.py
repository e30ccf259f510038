"""The activation ledger: every tensor a training step keeps for backward.

Published formulas (sbh(34 + 5as/h), Korthikanti et al. 2022) describe one
block with fused 16-bit kernels. The decoder the agent trains (agent/model.py)
saves other tensors: LayerNorm statistics, fp32 copies under autocast, the
clones a batched matmul makes of non-contiguous heads, flash attention's
log-sum-exp, dropout masks in the input's dtype on CPU. So the ledger replays
that model's forward symbolically, op by op, with each op's rule for what it
saves (``_Trace`` below), and applies the checkpoint policy the way
``torch.utils.checkpoint`` does:

- inside a checkpointed region nothing is kept but the region's inputs;
- under ``op-selective`` a region also keeps the outputs of its matmul and
  fused-attention ops (what ``create_selective_checkpoint_contexts`` caches);
- under ``offload`` the blocks' saved tensors live in host memory (on a device
  where ``save_on_cpu`` moves anything, i.e. CUDA).

Tensors are identified by storage, as the probe dedupes them: three linear
layers saving the same LayerNorm output cost one tensor. The ledger is checked
against agent/probe.py (autograd's own saved tensors) in tests/test_ledger.py;
core/devices.py says which device facts were measured where.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from fractions import Fraction
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from core.config import TrainConfig
from core.devices import DeviceRules, device_rules
from core.errors import ConfigError
from core.model import ModelSpec
from core.pipeline import RankKind, rank_kinds
from core.precision import DTYPE_BYTES
from core.recompute import RecomputePolicy
from core.stack import STACKS, Stack, get_stack

PROBABILITIES = ("log_softmax", "loss.softmax")
"""Names of the loss's fp32 probabilities over the vocabulary kept for backward: the log-probabilities, or the softmax
of Megatron's cross-entropy."""
Kind = Literal["activation", "input", "parameter_copy"]
MatmulOp = Literal["mm", "addmm", "bmm", "attention"]
"""The op whose output a selective checkpoint may cache: a linear without (mm) or with a bias (addmm), a batched
matmul (standard attention) or a fused attention kernel."""


@dataclass(frozen=True, slots=True)
class SavedTensor:
    name: str
    """Where it comes from, e.g. ``block.attn.softmax`` or ``log_softmax``."""
    shape: tuple[int, ...]
    dtype: str
    location: Literal["device", "host"]
    kind: Kind
    """``activation``, ``input`` (token ids, targets) or ``parameter_copy`` (autocast's 16-bit weights)."""
    layer: int | None
    """Block index, or None for the embedding, final norm, head and loss."""

    @property
    def bytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True, slots=True)
class Repeat:
    """Layers start..start+size-1 keep what layers template..template+size-1 kept, and so on for ``count``
    segments in a row: layers start..start + size x count - 1."""

    template: int
    start: int
    size: int
    count: int = 1

    @property
    def end(self) -> int:
        """The layer after the last repeated one."""
        return self.start + self.size * self.count


@dataclass(frozen=True, slots=True)
class Ledger:
    traced: tuple[SavedTensor, ...]
    """The tensors traced op by op: the first segments, the embedding, head and loss."""
    n_layers: int
    loss_gradient_bytes: int
    """Backward's first moment, on top of everything kept: the gradients of the log-probs (from
    nll_loss) and of the logits (from log_softmax), fp32 over the vocabulary, while the log-probs
    themselves are still alive (measured on an H200). Other stacks' cross-entropies (core.stack) add
    other tensors: Megatron's only the 16-bit gradient of the logits, torchtitan's (under tensor
    parallelism) three fp32 tensors over the vocabulary."""
    recompute_bytes: int
    """Later in backward: a checkpointed segment (or offloaded block) brought back, less the
    log-probs freed by then; 0 when nothing is brought back."""
    forward_transient_bytes: int
    """Forward's last moment, on top of everything kept: the logits the loss reads (fp32) and, when the
    head computes in 16 bits, the head's own output (measured on an H200). Under Megatron's
    cross-entropy, whose fp32 copy is what it keeps, the head's output only; under torchtitan's, one
    fp32 tensor over the vocabulary more."""
    ring_buffer_bytes: int = 0
    """Context parallelism: ring attention's buffers in one layer's backward, on top of what is kept:
    the K and V chunk being used and the next one arriving, with their gradients (2 x 2 x K, V)."""
    repeats: tuple[Repeat, ...] = ()
    """Later segments, kept as references to a traced one (an 80-layer model traces two segments)."""
    _totals: dict[tuple[str, str], int] = field(init=False, repr=False, compare=False)
    """Bytes by (kind, location), summed once: the planner reads them for every candidate."""
    _probability_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        totals: dict[tuple[str, str], int] = {}
        by_layer: dict[int, dict[tuple[str, str], int]] = {}
        probabilities = 0
        for t in self.traced:
            key, n = (t.kind, t.location), t.bytes
            totals[key] = totals.get(key, 0) + n
            if t.layer is not None:
                layer = by_layer.setdefault(t.layer, {})
                layer[key] = layer.get(key, 0) + n
            elif t.name in PROBABILITIES:
                probabilities += n
        for r in self.repeats:
            for layer in range(r.template, r.template + r.size):
                for key, n in by_layer.get(layer, {}).items():
                    totals[key] += n * r.count
        object.__setattr__(self, "_totals", totals)
        object.__setattr__(self, "_probability_bytes", probabilities)

    @property
    def probability_bytes(self) -> int:
        """The loss's fp32 probabilities over the vocabulary (``PROBABILITIES``), one micro-batch."""
        return self._probability_bytes

    @property
    def tensors(self) -> tuple[SavedTensor, ...]:
        """Every tensor kept, layer by layer (repeated segments written out)."""
        out = list(self.traced)
        for r in self.repeats:
            for start in range(r.start, r.end, r.size):
                out += [replace(t, layer=t.layer + start - r.template) for t in self.traced
                        if t.layer is not None and r.template <= t.layer < r.template + r.size]
        return tuple(out)

    @property
    def transient_bytes(self) -> int:
        """The most backward adds on top of what forward kept."""
        return max(self.loss_gradient_bytes, self.recompute_bytes, self.ring_buffer_bytes)

    def total(self, kind: Kind | None = None, location: str | None = None) -> int:
        if kind is not None and location is not None:
            return self._totals.get((kind, location), 0)
        return sum(
            n for (k, where), n in self._totals.items()
            if (kind is None or k == kind) and (location is None or where == location)
        )

    @property
    def saved_bytes(self) -> int:
        """Everything saved for backward but parameters: activations and token ids, device and host, one
        micro-batch. What the agent's probe measures and stores as ``activation_bytes``; not
        ``Estimate.activation_bytes`` (the device's activations in flight, without the log-probs)."""
        return self.total("activation") + self.total("input")

    @property
    def device_activation_bytes(self) -> int:
        return self.total("activation", "device") + self.total("input", "device")

    @property
    def host_bytes(self) -> int:
        return self.total(location="host")

    @property
    def parameter_copy_bytes(self) -> int:
        return self.total("parameter_copy", "device")

    def layer_bytes(self, layer: int) -> int:
        for r in self.repeats:
            if r.start <= layer < r.end:
                layer = r.template + (layer - r.start) % r.size
                break
        return sum(t.bytes for t in self.traced if t.layer == layer and t.kind != "parameter_copy")

    @property
    def per_layer_bytes(self) -> int:
        """Activation bytes block 0 keeps (every block keeps the same)."""
        return self.layer_bytes(0)


@dataclass(slots=True)
class _Sym:
    """A symbolic tensor: a storage, a shape and a dtype."""

    storage: int
    shape: tuple[int, ...]
    dtype: str
    name: str
    kind: Kind = "activation"
    storage_shape: tuple[int, ...] | None = None
    """The whole storage's shape when this is a view of part of it (a split): kept, the storage costs that."""


@dataclass(slots=True)
class _Trace:
    """Replays the forward pass, collecting what each op saves under the active policy."""

    rules: DeviceRules
    amp: bool
    layer: int | None = None
    region: Literal["none", "checkpoint", "op-selective"] = "none"
    offloading: bool = False
    stack: Stack = STACKS["reference"]
    """Whose kernels and checkpointing (core.stack)."""
    norm_offset: bool = False
    """The model's RMSNorm scales by 1 + weight in fp32 (core.model.ModelSpec.norm_offset)."""
    mm_count: int = 0
    """``aten.mm`` ops run so far in the current block."""
    kept: dict[int, SavedTensor] = field(default_factory=dict)
    weight_copies: dict[str, _Sym] = field(default_factory=dict)
    shared: dict[str, _Sym] = field(default_factory=dict)
    """Tensors the model makes once per forward and hands every layer (a stack's RoPE tables)."""
    repeats: list[Repeat] = field(default_factory=list)
    _next: int = 0

    # ---- bookkeeping -----------------------------------------------------------

    def new(self, name: str, shape: tuple[int, ...], dtype: str, kind: Kind = "activation") -> _Sym:
        self._next += 1
        return _Sym(self._next, shape, dtype, name if self.layer is None else f"block.{name}", kind)

    def save(self, *tensors: _Sym | None) -> None:
        """An op saves tensors for backward: kept unless inside a checkpointed region."""
        if self.region == "none":
            self.keep(*tensors)

    def keep(self, *tensors: _Sym | None) -> None:
        host = self.offloading and self.rules.offload_moves
        for t in tensors:
            # save_on_cpu copies each saved tensor on its own: one storage saved by two ops (a norm's
            # output read by three projections) is one tensor on the device but two host copies.
            key = self._fresh() if host else t.storage if t is not None else None
            if t is None or key in self.kept:
                continue
            # On the device a kept view holds its whole storage; save_on_cpu copies only the view's elements.
            shape = t.shape if host else t.storage_shape or t.shape
            self._store(key, SavedTensor(t.name, shape, t.dtype, "host" if host else "device", t.kind, self.layer))

    def _fresh(self) -> int:
        self._next += 1
        return self._next

    def _store(self, key: int, saved: SavedTensor) -> None:
        self.kept[key] = saved

    def once(self, name: str, shape: tuple[int, ...], dtype: str) -> _Sym:
        """A tensor made once per forward outside the blocks, the same storage for every layer that reads it."""
        if name not in self.shared:
            layer, self.layer = self.layer, None
            self.shared[name] = self.new(name, shape, dtype)
            self.layer = layer
        return self.shared[name]

    def keep_outside(self, *tensors: _Sym) -> None:
        """Keep tensors as the model's, not a block's (what a checkpoint wrapper called from the model keeps)."""
        layer, self.layer = self.layer, None
        self.keep(*tensors)
        self.layer = layer

    def repeat_segments(self, template_start: int, start: int, count: int, size: int, x: _Sym) -> _Sym:
        """Keep for ``count`` segments of ``size`` layers from ``start`` what the one at ``template_start`` kept;
        return a new output of the last."""
        self.repeats.append(Repeat(template_start, start, size, count))
        self._next += 1
        return _Sym(self._next, x.shape, x.dtype, x.name, x.kind)

    def matmul_output(self, t: _Sym, op: MatmulOp = "mm") -> _Sym:
        """Selective-checkpoint contexts cache the outputs of matmul and attention kernels (``op``): every one, or
        under torchtitan's policy neither every second ``aten.mm`` of a block nor the CPU's fused attention."""
        if op == "mm":
            self.mm_count += 1
        if self.region != "op-selective":
            return t
        if op == "mm" and self.stack.every_other_mm and self.mm_count % 2 == 0:
            return t
        if op == "attention" and self.rules.device == "cpu" and not self.stack.caches_cpu_attention:
            return t
        self.keep(t)
        return t

    @contextlib.contextmanager
    def checkpointed(self, *inputs: _Sym, kind: Literal["checkpoint", "op-selective"] = "checkpoint") -> Iterator[None]:
        self.save(*inputs)  # non-reentrant checkpoint keeps its inputs
        outer, self.region = self.region, kind
        try:
            yield
        finally:
            self.region = outer

    # ---- ops: each rule is what autograd saves for that op ----------------------------

    def cast(self, x: _Sym, dtype: str, name: str) -> _Sym:
        return x if x.dtype == dtype else self.new(name, x.shape, dtype)

    def param(self, name: str, shape: tuple[int, ...], param_dtype: str) -> _Sym | None:
        """A parameter an op saves: free (None), unless ``save_on_cpu`` copies it to the host."""
        if self.offloading and self.rules.offload_moves:
            return self.new(f"{name}_host", shape, param_dtype, "parameter_copy")
        return None

    def weight(self, name: str, shape: tuple[int, int], param_dtype: str) -> _Sym | None:
        """The weight a matmul saves, when it costs memory beyond the parameter itself.

        Under autocast: the cached 16-bit copy. When offloading to the host:
        ``save_on_cpu`` copies every saved tensor, parameters included.
        Otherwise the parameter itself, which is not an activation (None).
        """
        if self.amp:
            key = f"{self.layer}.{name}"  # autocast caches one copy per parameter per forward
            if key not in self.weight_copies:
                self.weight_copies[key] = self.new(f"{name}.weight_bf16", shape, "bf16", "parameter_copy")
            return self.weight_copies[key]
        return self.param(f"{name}.weight", shape, param_dtype)

    def linear(self, x: _Sym, name: str, out_features: int, param_dtype: str, kept: _Sym | None = None,
               rows: int | None = None, stacked: int = 1, bias: bool = False) -> _Sym:
        """Saves its input (cast to bf16 per call under autocast) and its weight.

        ``kept``: what backward keeps instead of x (a sharded input gathered again in backward);
        ``rows``: the output's sequence length after a row-parallel reduce-scatter (sequence parallel);
        ``stacked``: x is the rows of that many linears of this shape (experts), one weight each;
        ``bias``: the layer has one, so torch runs it as one ``aten.addmm`` rather than an ``aten.mm``.
        """
        x_in = self.cast(x, "bf16", f"{name}.input_bf16") if self.amp else x
        saved = self.cast(kept, "bf16", f"{name}.input_bf16") if kept is not None and self.amp else kept or x_in
        self.save(saved, self.weight(name, (stacked * out_features, x.shape[-1]), param_dtype))
        shape = (*x.shape[:-2], rows if rows is not None else x.shape[-2], out_features)
        return self.matmul_output(self.new(f"{name}.out", shape, x_in.dtype), "addmm" if bias else "mm")

    def layer_norm(self, x: _Sym, name: str, param_dtype: str) -> _Sym:
        """Saves its input, mean, rstd, weight and bias; the output is recomputed from them."""
        stats = "fp32" if x.dtype == "fp32" or self.rules.norm_stats_fp32 else x.dtype
        rows = x.shape[:-1] + (1,)
        h = (x.shape[-1],)
        self.save(x, self.new(f"{name}.mean", rows, stats), self.new(f"{name}.rstd", rows, stats),
                  self.param(f"{name}.weight", h, param_dtype), self.param(f"{name}.bias", h, param_dtype))
        return self.new(f"{name}.out", x.shape, x.dtype)

    def rms_norm(self, x: _Sym, name: str, param_dtype: str) -> _Sym:
        """RMSNorm: the stack's kernel (core.stack); torch's is the fused one where the device has it.

        Fused (torch's ``_fused_rms_norm`` on CUDA, Transformer Engine's): backward
        keeps the input, an fp32 rstd per row and the weight (torch's
        derivatives.yaml). torch's composite (CPU, meta): upcast, x * rsqrt(mean(x^2)
        + eps), times weight, cast back; it keeps the fp32 input, the rsqrt and
        the fp32 normalised tensor. transformers' composite casts back before
        the weight: it keeps the normalised tensor in the input's dtype; Gemma's
        scales by 1 + weight in fp32 first, keeping the fp32 normalised tensor
        and the fp32 1 + weight.
        """
        rows = x.shape[:-1] + (1,)
        weight = self.param(f"{name}.weight", (x.shape[-1],), param_dtype)
        kernel = self.stack.rms_norm
        if kernel == "fused" or (kernel == "torch" and self.rules.fused_rms_norm):
            self.save(x, self.new(f"{name}.rstd", rows, "fp32"), weight)
            return self.new(f"{name}.out", x.shape, x.dtype)
        upcast = self.cast(x, "fp32", f"{name}.input_fp32")
        normed = self.new(f"{name}.normalized", x.shape, "fp32")
        if kernel == "hf" and self.norm_offset:
            # Gemma's: the fp32 normalised tensor times 1 + weight.float(), cast back; the product keeps both.
            plus_one = self.new(f"{name}.weight_plus_one", (x.shape[-1],), "fp32")
            self.save(upcast, self.new(f"{name}.rsqrt", rows, "fp32"), normed, plus_one)
            return self.cast(self.new(f"{name}.out", x.shape, "fp32"), x.dtype, f"{name}.out_cast")
        if kernel == "hf":  # cast back, then the weight: the product keeps the cast
            normed = self.cast(normed, x.dtype, f"{name}.normalized_cast")
            out = self.new(f"{name}.out", x.shape, x.dtype)
        else:
            out = self.cast(self.new(f"{name}.out", x.shape, "fp32"), x.dtype, f"{name}.out_cast")
        self.save(upcast, self.new(f"{name}.rsqrt", rows, "fp32"), normed, weight)
        return out

    def dropout(self, x: _Sym, name: str) -> _Sym:
        """Saves the mask; the output is a new tensor."""
        if self.rules.dropout_mask_bytes == 1:
            self.save(self.new(f"{name}.mask", x.shape, "bool"))
        else:
            self.save(self.new(f"{name}.mask", x.shape, x.dtype))
        return self.new(f"{name}.out", x.shape, x.dtype)


@dataclass(frozen=True, slots=True)
class _Dims:
    """The sizes one rank sees: the sequence split by cp (and the residual stream by tp under sp),
    heads, widths and vocabulary split by tp."""

    b: int
    s: int
    """Tokens per sequence on this rank: s / cp."""
    rows: int
    """Sequence length of the residual stream, norms and dropouts: s / cp, and / tp under sp."""
    h: int
    q: int
    """Query projection width: n_heads x head_dim / tp."""
    kv: int
    """Key (and value) projection width: kv_dim / tp."""
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    """The head's output width on this rank: vocab / tp."""
    loss_vocab: int
    """The logits the loss reads on this rank: vocab / tp, or the whole vocabulary where the stack gathers the
    head's output (Stack.gathers_logits)."""
    sp: bool
    """Sequence parallelism: column-parallel linears read an all-gathered input."""
    keep_gathered: bool
    """Backward keeps that gathered input (torch) rather than the sharded one (megatron)."""

    @classmethod
    def of(cls, spec: ModelSpec, cfg: TrainConfig) -> _Dims:
        lay = cfg.layout
        t, s = lay.tp, cfg.seq_len // lay.cp
        stack = get_stack(cfg.stack)
        return cls(b=cfg.micro_batch, s=s, rows=s // t if lay.sp else s, h=spec.hidden, q=spec.q_dim // t,
                   kv=spec.kv_dim // t, heads=spec.n_heads // t, kv_heads=spec.n_kv_heads // t,
                   head_dim=spec.head_dim, ffn=spec.ffn_hidden // t, vocab=spec.vocab_size // t,
                   loss_vocab=spec.vocab_size if stack.gathers_logits else spec.vocab_size // t, sp=lay.sp,
                   keep_gathered=stack.sp_keeps_gathered_input)

    @property
    def tokens(self) -> int:
        """Tokens whose logits this rank computes: b x s / cp."""
        return self.b * self.s


def _attention(tr: _Trace, d: _Dims, cfg: TrainConfig, q: _Sym, k: _Sym, v: _Sym, v_head_dim: int | None = None,
               qk_contiguous: bool = False, capped: bool = False, masked: bool = False) -> _Sym:
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
        tr.save(q, k, v, mask, out, lse, *rng)
        # Laid out (b, s, a, d): the output projection reads a view of the same storage.
        return _Sym(out.storage, (b, s, a * dv), out.dtype, out.name)
    if cfg.attention == "flash":
        # SDPA's math path: upcasts 16-bit inputs, scales q and k, no mask tensor kept.
        acc = "fp32"
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
        mask = None if eager else tr.new("attn.causal_mask", (s, s), "bool")
        softmax_dtype = "fp32" if eager or (tr.amp and tr.rules.autocast_softmax_fp32) else q.dtype
        capped = capped and eager
    scores = tr.matmul_output(tr.new("attn.scores", (b, a, s, s), q_b.dtype), "bmm")
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
    y = tr.matmul_output(tr.new("attn.pv", v_heads, v_b.dtype), "bmm")
    del y
    return tr.new("attn.out_heads_merged", (b, s, a * dv), q.dtype)


def _heads(x: _Sym, heads: int, head_dim: int) -> _Sym:
    """A projection's output (b, s, heads x head_dim) viewed per head: the same storage."""
    return _view(x, (*x.shape[:-1], heads, head_dim))


def _view(x: _Sym, shape: tuple[int, ...]) -> _Sym:
    """A view of all or part of x's storage (a reshape, a split, a slice): kept, it costs the whole storage."""
    return _Sym(x.storage, shape, x.dtype, x.name, x.kind, x.storage_shape or x.shape)


def _rotary(tr: _Trace, d: _Dims, q: _Sym, k: _Sym, rotary_dim: int, dtype: str, local: bool = False
            ) -> tuple[_Sym, _Sym]:
    """q and k rotated, with what the stack's RoPE keeps (core.stack): the reference's tables made in each
    layer and cast per call; Megatron's fused kernel one fp32 ``freqs`` table for the whole forward; transformers
    cos and sin made once in the residual stream's dtype ``dtype``, a pair of their own for ``local`` layers
    (ModelSpec.local_rope). Nothing else: the tables need no gradient."""
    if tr.stack.rope == "per-layer":
        tables = (tr.new("rope.cos", (d.s, rotary_dim), "fp32"), tr.new("rope.sin", (d.s, rotary_dim), "fp32"))
        return _rope(tr, q, tables, "attn.q_rope"), _rope(tr, k, tables, "attn.k_rope")
    if tr.stack.rope == "shared-fp32":
        tr.save(tr.once("rope.freqs", (d.s, 1, 1, rotary_dim), "fp32"))
    else:
        tr.save(*_shared_tables(tr, d, rotary_dim, dtype, local))
    return tr.new("attn.q_rope.rotated", q.shape, q.dtype), tr.new("attn.k_rope.rotated", k.shape, k.dtype)


def _shared_tables(tr: _Trace, d: _Dims, rotary_dim: int, dtype: str, local: bool = False) -> tuple[_Sym, _Sym]:
    """transformers' cos and sin: (1, s, rotary_dim), one pair per forward (and kind of layer: ``local``)."""
    kind = "rope.local" if local else "rope"
    return tuple(tr.once(f"{kind}.{f}", (1, d.s, rotary_dim), dtype) for f in ("cos", "sin"))


def _rope(tr: _Trace, x: _Sym, tables: tuple[_Sym, _Sym], name: str) -> _Sym:
    """x * cos + rotate_half(x) * sin: saves cos and sin, cast to x's dtype per call. Partial rotary
    rotates the first rotary_dim of each head and concatenates the rest back: the tables are that wide."""
    cos, sin = (tr.cast(t, x.dtype, f"{name}.{t.name.rsplit('.', 1)[-1]}_cast") for t in tables)
    tr.save(cos, sin)
    return tr.new(f"{name}.rotated", x.shape, x.dtype)


def _column_input(tr: _Trace, d: _Dims, x: _Sym, name: str) -> tuple[_Sym, _Sym | None]:
    """What a column-parallel linear reads, and what its backward keeps instead when that differs.

    Without sequence parallelism: x itself. With it, x is all-gathered over the sequence first;
    ``torch`` keeps the gathered tensor, ``megatron`` keeps x and gathers again in backward.
    """
    if not d.sp:
        return x, None
    gathered = tr.new(f"{name}.gathered", (d.b, d.s, x.shape[-1]), x.dtype)
    return gathered, None if d.keep_gathered else x


def _block(tr: _Trace, spec: ModelSpec, d: _Dims, cfg: TrainConfig, x: _Sym, param_dtype: str) -> _Sym:
    b, rows, h = d.b, d.rows, d.h
    gpt = spec.block == "gpt"
    norm = tr.layer_norm if gpt else tr.rms_norm

    a, kept = _column_input(tr, d, norm(x, "attn_norm", param_dtype), "attn_norm")
    tr.mm_count = 0  # a checkpointed block counts its own matmuls (torchtitan's SAC)
    qkv_bias, other_bias = spec.bias in ("qkv", "all"), spec.bias == "all"
    if spec.is_mla:
        q, k, v = _latent_qkv(tr, spec, d, a, param_dtype)
        attention = functools.partial(_attention, v_head_dim=spec.v_head_size, qk_contiguous=True)
    else:
        q, k, v = _qkv(tr, d, a, param_dtype, kept, qkv_bias)
        if spec.qk_norm:  # over each head: the projection's output seen as (b, s, heads, head_dim)
            q = tr.rms_norm(_heads(q, d.heads, d.head_dim), "attn.q_norm", param_dtype)
            k = tr.rms_norm(_heads(k, d.kv_heads, d.head_dim), "attn.k_norm", param_dtype)
        if spec.rotary:
            q, k = _rotary(tr, d, q, k, spec.rotary_dim, x.dtype, _local_rope(spec, tr.layer))
        attention = _attention
    capped, masked = bool(spec.attention_softcap), _sdpa_masked(spec, cfg, tr.layer)
    if cfg.recompute.recomputes_attention:
        with tr.checkpointed(q, k, v):
            y = attention(tr, d, cfg, q, k, v, capped=capped, masked=masked)
    else:
        y = attention(tr, d, cfg, q, k, v, capped=capped, masked=masked)
    o = tr.linear(y, "attn.o_proj", h, param_dtype, rows=rows, bias=other_bias)
    if spec.post_norms:
        o = norm(o, "attn_post_norm", param_dtype)
    if cfg.dropout > 0:
        o = tr.dropout(o, "attn.resid_dropout")
    if not spec.parallel_residual:  # else the MLP reads the block's input too
        x = tr.new("residual_attn", (b, rows, h), x.dtype)

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
    return tr.new("residual_mlp", (b, rows, h), x.dtype)


def _qkv(tr: _Trace, d: _Dims, a: _Sym, param_dtype: str, kept: _Sym | None, bias: bool) -> tuple[_Sym, _Sym, _Sym]:
    """q, k and v from three linears, or (torchtitan's ``wqkv``) from one whose output is copied out as three
    contiguous tensors: one matmul, one input cast under autocast, and no copy kept."""
    if not tr.stack.fused_qkv:
        return (tr.linear(a, "attn.q_proj", d.q, param_dtype, kept, bias=bias),
                tr.linear(a, "attn.k_proj", d.kv, param_dtype, kept, bias=bias),
                tr.linear(a, "attn.v_proj", d.kv, param_dtype, kept, bias=bias))
    qkv = tr.linear(a, "attn.qkv_proj", d.q + 2 * d.kv, param_dtype, kept, bias=bias)
    return tuple(tr.new(f"attn.{name}", (*qkv.shape[:-1], width), qkv.dtype)
                 for name, width in (("q", d.q), ("k", d.kv), ("v", d.kv)))


def _latent_qkv(tr: _Trace, spec: ModelSpec, d: _Dims, x: _Sym, param_dtype: str) -> tuple[_Sym, _Sym, _Sym]:
    """Multi-head latent attention's q, k and v (agent.model.LatentAttention, as transformers' DeepseekV3Attention).

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
    normed = tr.rms_norm(_view(kv, (b, s, rkv)), "attn.kv_a_norm", param_dtype)
    kv_up = tr.linear(normed, "attn.kv_b_proj", a * (dqk - dr + dv), param_dtype)
    tables = (tr.new("rope.cos", (s, dr), "fp32"), tr.new("rope.sin", (s, dr), "fp32"))
    _rope(tr, _view(q, (b, a, s, dr)), tables, "attn.q_rope")
    k_rot = _rope(tr, _view(kv, (b, 1, s, dr)), tables, "attn.k_rope")
    q = tr.new("attn.q_cat", (b, a, s, dqk), q.dtype)  # cat keeps nothing for backward
    k = tr.new("attn.k_cat", (b, a, s, dqk), k_rot.dtype)
    return q, k, _view(kv_up, (b, a, s, dv))


def _swiglu(tr: _Trace, x: _Sym, name: str, width: int, out: int, param_dtype: str, kept: _Sym | None = None,
            rows: int | None = None, stacked: int = 1, bias: bool = False) -> _Sym:
    """down(silu(gate(x)) * up(x)): what a gated MLP keeps; returns the down projection's output.

    ``kept``, ``rows`` and ``bias`` as for ``_Trace.linear``; ``stacked``: x holds the rows of that many
    experts, each with its own weights. What the product keeps is the stack's (core.stack.Swiglu): Megatron's
    fused kernel reads gate and up as one fc1 output and keeps only that, Liger's keeps gate and up, and both
    recompute SiLU in backward."""
    if tr.stack.swiglu == "fc1":
        fc1 = tr.linear(x, f"{name}.fc1", 2 * width, param_dtype, kept, stacked=stacked, bias=bias)
        tr.save(fc1)
        hidden = tr.new(f"{name}.swiglu", (*fc1.shape[:-1], width), fc1.dtype)
        return tr.linear(hidden, f"{name}.down_proj", out, param_dtype, rows=rows, stacked=stacked, bias=bias)
    gate = tr.linear(x, f"{name}.gate_proj", width, param_dtype, kept, stacked=stacked, bias=bias)
    up = tr.linear(x, f"{name}.up_proj", width, param_dtype, kept, stacked=stacked, bias=bias)
    if tr.stack.swiglu == "silu-mul":
        tr.save(gate, up)
    else:
        tr.save(gate)  # SiLU saves its input
        silu = tr.new(f"{name}.silu", gate.shape, gate.dtype)
        tr.save(silu, up)  # the product saves both factors
    hidden = tr.new(f"{name}.swiglu", gate.shape, gate.dtype)
    return tr.linear(hidden, f"{name}.down_proj", out, param_dtype, rows=rows, stacked=stacked, bias=bias)


def _experts(tr: _Trace, spec: ModelSpec, d: _Dims, x: _Sym, param_dtype: str, ep: int = 1) -> _Sym:
    """A mixture-of-experts MLP, dropless (agent.model.Experts), over this rank's t tokens.

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
    gone and the rest padded (agent.model.Experts): E x capacity rows in place of t x k.
    """
    t, h, k = d.b * d.rows, d.h, spec.experts_per_token
    routed = spec.expert_rows(t)
    flat = _Sym(x.storage, (t, h), x.dtype, x.name, x.kind)  # a view: (b, s, h) as (t, h)
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


def _segment(tr: _Trace, spec: ModelSpec, d: _Dims, cfg: TrainConfig, x: _Sym, param_dtype: str,
             start: int, end: int) -> _Sym:
    """Blocks start..end-1 under the policy: one checkpointed region, or plain (offloaded) blocks."""
    policy = cfg.recompute
    tr.layer = start
    if policy.recomputes_blocks or policy.caches_matmuls:
        if tr.stack.rope == "shared" and spec.rotary:
            # transformers hands each checkpointed layer cos, sin and the positions: kept once, as the model's.
            for layer in range(start, end):
                tr.keep_outside(*_shared_tables(tr, d, spec.rotary_dim, x.dtype, _local_rope(spec, layer)))
            tr.keep_outside(tr.once("positions", (d.s,), "int64"))
        if tr.stack.transformers_modules and cfg.attention == "standard":
            # and its eager attention the additive mask of the layer's kind, made once per forward
            tr.keep_outside(*(_eager_mask(tr, spec, d, layer, x.dtype) for layer in range(start, end)))
        elif tr.stack.transformers_modules:
            # SDPA a sliding-window layer's boolean mask, where it is explicit: one (s, s) expanded over the batch
            tr.keep_outside(*(tr.once("attention_mask.sliding_sdpa", (1, 1, d.s, d.s), "bool")
                              for layer in range(start, end) if _sdpa_masked(spec, cfg, layer)))
        with tr.checkpointed(x, kind="op-selective" if policy.caches_matmuls else "checkpoint"):
            if not policy.caches_matmuls:
                # A checkpointed region keeps nothing but its input: its blocks need not be traced (most of a
                # layout search's traces), only their output made, as the last block's residual add makes it.
                tr.layer = end - 1
                return tr.new("residual_mlp", x.shape, x.dtype)
            for layer in range(start, end):
                tr.layer = layer
                x = _block(tr, spec, d, cfg, x, param_dtype)
        return x
    tr.offloading = policy.offloads
    for layer in range(start, end):
        tr.layer = layer
        x = _block(tr, spec, d, cfg, x, param_dtype)
    tr.offloading = False
    return x


def _eager_mask(tr: _Trace, spec: ModelSpec, d: _Dims, layer: int, dtype: str) -> _Sym:
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


def _segment_kinds(tr: _Trace, spec: ModelSpec, start: int, end: int) -> tuple:
    """What a segment of blocks keeps depends on: its length, and each block's kind, where blocks differ:
    experts in place of the MLP, and under transformers' modules a sliding window (its mask, its RoPE tables)."""
    windowed = tr.stack.transformers_modules and spec.sliding_window_pattern > 1
    if not (spec.is_moe or windowed):
        return (end - start,)
    return (end - start, *((spec.is_moe_layer(n), windowed and spec.sliding(n)) for n in range(start, end)))


def _local_rope(spec: ModelSpec, layer: int | None) -> bool:
    """Does ``layer`` rotate by the sliding-window layers' own RoPE tables (ModelSpec.local_rope)?"""
    return spec.local_rope and spec.sliding(layer or 0)


def _sdpa_masked(spec: ModelSpec, cfg: TrainConfig, layer: int | None) -> bool:
    """Does transformers hand ``layer``'s SDPA an explicit mask (TrainConfig.sdpa_masked, ModelSpec.sdpa_mask)?"""
    return cfg.sdpa_masked(spec) and spec.sdpa_mask(cfg.seq_len, layer or 0)


def _trace(spec: ModelSpec, cfg: TrainConfig, rules: DeviceRules, rank: RankKind) -> _Trace:
    param_dtype = cfg.block_param_dtype
    tr = _new_trace(spec, cfg, rules)
    d = _Dims.of(spec, cfg)
    b, h = d.b, d.h

    if rank.first:
        tokens = tr.new("tokens", (b, d.s), "int64", "input")
        tr.save(tokens)  # the embedding's backward needs the indices
        x = tr.new("embed", (b, d.rows, h), param_dtype)
        if not spec.rotary:
            tr.save(tr.new("positions", (d.s,), "int64"))
            x = tr.new("embed_sum", (b, d.rows, h), param_dtype)
        if spec.scaled_embedding and tr.stack.transformers_modules:  # times sqrt(h): the product keeps the scalar
            tr.save(tr.new("embed_scale", (), param_dtype, "input"))
            x = tr.new("embed_scaled", (b, d.rows, h), param_dtype)
        if cfg.dropout > 0:
            x = tr.dropout(x, "embed_dropout")
    else:  # the previous stage's output, received
        x = tr.new("stage_input", (b, d.rows, h), param_dtype)

    policy, n = cfg.recompute, rank.layers
    size = policy.segment_layers(n) if policy.recomputes_blocks else 1
    # A segment saves what an earlier one of the same length and kinds of layer saved (core.ledger.Repeat):
    # replayed instead of traced, an 80-layer model costs two segments. The first segment, and any that made a
    # tensor the model makes once (a RoPE table, a mask), are no template.
    templates: dict[tuple, int] = {}
    run: list[int] = []  # the segments replayed in a row from one template: template, first start, count
    for i, start in enumerate(range(0, n, size)):
        end = min(start + size, n)
        kinds = _segment_kinds(tr, spec, start, end)
        if (template := templates.get(kinds)) is not None and run and run[0] == template:
            run[2] += 1
            continue
        if run:
            x = tr.repeat_segments(*run, size, x)
            run = []
        if template is not None:
            run = [template, start, 1]
            continue
        shared = len(tr.shared)
        x = _segment(tr, spec, d, cfg, x, param_dtype, start, end)
        if i and len(tr.shared) == shared:
            templates[kinds] = start
    if run:
        x = tr.repeat_segments(*run, size, x)
    tr.layer = None
    if not rank.last:
        return tr

    final = (tr.layer_norm if spec.block == "gpt" else tr.rms_norm)(x, "final_norm", param_dtype)
    loss = tr.stack.loss_at(cfg.layout.tp)
    if loss == "fused-linear":
        # Liger's fused head and loss computes both gradients in forward and keeps them, not the logits (core.stack).
        tr.save(tr.new("loss.grad_input", (d.tokens, h), final.dtype),
                tr.new("loss.grad_weight", (d.vocab, h), param_dtype))
        return tr
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
        # mask and the targets; its training script's loss_func keeps the fp32 loss mask (core.stack).
        tr.save(
            tr.new("loss.softmax", (d.tokens, d.loss_vocab), "fp32"),
            tr.new("loss.target_mask", (d.tokens,), "bool"),
            tr.new("loss.masked_target", (d.tokens,), "int64"),
            tr.new("loss.mask", (d.tokens,), "fp32", "input"),
        )
        return tr
    tr.save(
        tr.new("log_softmax", (d.tokens, d.loss_vocab), "fp32"),
        _targets(tr, d),
        tr.new("loss.total_weight", (), "fp32") if loss == "log-softmax" else None,  # nll_loss's
    )
    return tr


def _targets(tr: _Trace, d: _Dims) -> _Sym:
    """The token ids the loss keeps. transformers' loss pads the labels by one and shifts them: ``.contiguous()``
    copies the shifted rows, except for one sequence, whose shift is a view of the padded (1, s + 1) ids."""
    if tr.stack.transformers_modules and d.b == 1:
        return _view(tr.new("targets_padded", (1, d.s + 1), "int64", "input"), (d.tokens,))
    return tr.new("targets", (d.tokens,), "int64", "input")


def _new_trace(spec: ModelSpec, cfg: TrainConfig, rules: DeviceRules, layer: int | None = None) -> _Trace:
    return _Trace(rules=rules, amp=cfg.runs_autocast, layer=layer, stack=get_stack(cfg.stack),
                  norm_offset=spec.norm_offset)


def activation_ledger(spec: ModelSpec, config: TrainConfig, device: str = "cuda",
                      rules: DeviceRules | None = None, rank: RankKind | None = None) -> Ledger:
    """Every tensor one micro-batch keeps for backward on one rank of the layout, on ``device``.

    ``rank``: the pipeline stage (core.pipeline); by default the first (the only one without a
    pipeline). Tensor, sequence and context parallelism shrink the shapes (core.ledger._Dims).
    ``rules`` replaces the device's (core.devices), e.g. to predict SDPA forced onto its math path.
    """
    config.check_model(spec)
    rules = rules or device_rules(device)
    rank = rank or rank_kinds(config.layout, spec.n_layers, 1)[0]
    one_micro_batch = rank if rank.in_flight == 1 else replace(rank, in_flight=Fraction(1))
    key = (spec, _ledger_key(config), rules, one_micro_batch)
    kept = _kept_ledgers.get()
    if kept is None:
        return _cached_ledger(*key)
    if (ledger := kept.get(key)) is None:
        ledger = kept[key] = _cached_ledger(*key)
    return ledger


_kept_ledgers: ContextVar[dict[tuple[ModelSpec, TrainConfig, DeviceRules, RankKind], Ledger] | None] = ContextVar(
    "kept_ledgers", default=None)


@contextlib.contextmanager
def ledgers_kept() -> Iterator[None]:
    """Every ledger made inside is kept until the outermost one ends (a decorator too). A layout search asks
    for each of its ledgers many times and for more of them than the process-wide cache holds (2,048):
    4,096 GPUs of llama2-7b ask for 46,724 ledgers and traced 82,347 through that cache alone, each second
    copy held by its candidates beside the first. Kept per thread (a context variable)."""
    token = _kept_ledgers.set({}) if _kept_ledgers.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _kept_ledgers.reset(token)


@functools.lru_cache(maxsize=4096)
def _ledger_key(config: TrainConfig) -> TrainConfig:
    """The configuration with what one micro-batch's ledger ignores set to one value (a layout search
    shares one ledger among them): the data-parallel ranks, the pipeline schedule (the rank's layers
    carry it), and the sharding stage except whether FSDP gathers 16-bit units. Expert parallelism
    stays: it decides which experts' weights the rank copies (dp = ep keeps the layout valid)."""
    fsdp_mixed = config.zero == 3 and config.recipe.autocast
    layout = replace(config.layout, dp=config.layout.ep, zero=3 if fsdp_mixed else 0, schedule="1f1b",
                     virtual_stages=1)
    return replace(config, layout=layout) if layout != config.layout else config


@functools.lru_cache(maxsize=2048)
def _cached_ledger(spec: ModelSpec, config: TrainConfig, rules: DeviceRules, rank: RankKind) -> Ledger:
    if config.recipe.autocast and not rules.autocast:
        raise ConfigError(f"amp-bf16 needs autocast, which the {rules.device} device does not have")
    if rules.fused_attention_mask is None and (refusal := masked_sdpa_refusal(spec, config)):
        raise ConfigError(refusal)
    tr = _trace(spec, config, rules, rank)
    d = _Dims.of(spec, config)
    fp32_over_vocab = d.tokens * d.loss_vocab * 4 if rank.last else 0
    # The head's output (gathered, where the stack gathers it) is 16-bit unless the model computes in fp32; the
    # loss reads an fp32 copy.
    head_output = 0 if config.recipe.compute_dtype == "fp32" or not rank.last else d.tokens * d.loss_vocab * 2
    loss = tr.stack.loss_at(config.layout.tp)
    freed_by_blocks = fp32_over_vocab  # what the loss kept, gone when the blocks' backward runs
    if loss == "fused-linear" and rank.last:
        # Liger's: one chunk of logits at a time (_fused_linear_chunk_bytes); backward scales its gradients in place.
        grad_input, grad_weight = (t for t in tr.kept.values() if t.name in ("loss.grad_input", "loss.grad_weight"))
        input_bytes = grad_input.bytes // (d.tokens * d.h)
        forward_transient, loss_gradient = _fused_linear_chunk_bytes(d, tr.amp, input_bytes, rules.device), 0
        freed_by_blocks = grad_input.bytes + grad_weight.bytes
    elif loss == "vocab-parallel":
        # The fp32 copy is the softmax kept, and backward writes the gradient into it: beyond what is kept, the
        # 16-bit logits in forward and their gradient, cast back to 16 bits, in backward.
        forward_transient, loss_gradient = head_output, head_output
    elif loss == "loss-parallel":
        # The fp32 logits and their shifted copy beside the log-probs (and the 16-bit logits); backward, the
        # targets' -1 scattered into zeros, the exp of the log-probs and their sum, all fp32.
        forward_transient, loss_gradient = 2 * fp32_over_vocab + head_output, 3 * fp32_over_vocab
    else:
        # The fp32 copy beside the log-probs and the 16-bit logits; backward, the log-probs' gradient (from
        # nll_loss) and the logits' (from log_softmax), both fp32.
        forward_transient, loss_gradient = fp32_over_vocab + head_output, 2 * fp32_over_vocab
    kv_chunk = 2 * d.b * d.s * d.kv * config.recipe.activation_bytes  # this rank's K and V of one layer
    ring = 4 * kv_chunk if config.layout.cp > 1 else 0
    return Ledger(tuple(tr.kept.values()), rank.layers, repeats=tuple(tr.repeats), loss_gradient_bytes=loss_gradient,
                  recompute_bytes=_recompute_bytes(spec, config, rules, freed_by_blocks),
                  forward_transient_bytes=forward_transient, ring_buffer_bytes=ring)


def _fused_linear_chunk_bytes(d: _Dims, amp: bool, input_bytes: int, device: str) -> int:
    """Liger's fused linear cross-entropy at its forward's peak, beyond what it keeps
    (``ops/fused_linear_cross_entropy.py``, liger-kernel 0.8).

    Its loop over chunks of ``next_pow2(ceil(tokens / ceil(V / h)))`` rows (at most every token) makes one chunk
    of logits in the matmul's dtype (16-bit under autocast, else the input's) and, while it lives, the chunk of the
    input's gradient, then the weight's gradient: accumulated in place on a CUDA device for 16-bit logits
    (``addmm``), else through a whole ``V x h`` product (and its fp32 copy for 16-bit logits). Beside them, the
    per-token fp32 losses. Under autocast the head weight's 16-bit copy is in autocast's cache with every other
    weight's (core.estimate), not here.
    """
    tokens, h, vocab = d.tokens, d.h, d.vocab
    rows = min(tokens, 1 << (-(-tokens // -(-vocab // h)) - 1).bit_length())
    matmul = 2 if amp else input_bytes
    if device == "cuda" and matmul == 2:
        weight_gradient = 0
    else:
        weight_gradient = vocab * h * (matmul + (4 if matmul != 4 else 0))
    return rows * vocab * matmul + max(rows * h * matmul, weight_gradient) + 4 * tokens


def _recompute_bytes(spec: ModelSpec, config: TrainConfig, rules: DeviceRules, loss_kept: int) -> int:
    """What backward brings back at once, on top of what forward kept, once the loss's tensors are freed.

    A checkpointed segment or an offloaded block: what its blocks keep without
    recompute (full, every-K, op-selective, offload), or one attention core
    (selective). What the loss kept (``loss_kept``: its probabilities over the vocabulary, or Liger's two
    gradients) is freed by the time a block's backward runs.
    """
    policy = config.recompute
    if not policy.recomputes and not (policy.offloads and rules.offload_moves):
        return 0
    # The largest block: a mixture of experts' last (a routed one), or any.
    layer = spec.n_layers - 1
    block = _block_bytes(spec, config, rules, "none", layer)
    if spec.dense_layers:
        block = max(block, _block_bytes(spec, config, rules, "none", 0))
    if policy.recomputes_blocks:
        segment = policy.segment_layers(spec.n_layers // config.layout.pp) * block
    elif policy.recomputes_attention:
        segment = block - _block_bytes(spec, config, rules, "selective", layer)
    else:  # op-selective recomputes, offload brings back, one block at a time
        segment = block
    return max(0, segment - loss_kept)


def _block_bytes(spec: ModelSpec, config: TrainConfig, rules: DeviceRules, policy: str, layer: int) -> int:
    """Activation bytes block ``layer`` keeps under ``none`` or ``selective``, whatever ``config``'s own policy
    (every policy of one layout asks the same question)."""
    return _policy_block_bytes(spec, replace(config, recompute=RecomputePolicy(policy)), rules, layer)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=1024)
def _policy_block_bytes(spec: ModelSpec, cfg: TrainConfig, rules: DeviceRules, layer: int) -> int:
    param_dtype = cfg.block_param_dtype
    d = _Dims.of(spec, cfg)
    tr = _new_trace(spec, cfg, rules, layer)
    x = tr.new("input", (d.b, d.rows, d.h), param_dtype)
    _block(tr, spec, d, cfg, x, param_dtype)
    return sum(t.bytes for t in tr.kept.values() if t.kind == "activation")
