"""The vocabulary of a symbolic forward: tensors, the trace that collects what each op keeps, a rank's sizes.

A `Sym` is a tensor by storage, shape and dtype; `Trace` replays ops on them, each op with its rule for what
autograd saves (its methods: a linear, the norms, dropout, casts), and applies the checkpoint policy the way
``torch.utils.checkpoint`` does (core/memory/ledger.py says how). `Dims` are the sizes one rank of a layout sees.
core/memory/attention_trace.py and core/memory/forward_trace.py build the model's forward from these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import DeviceRules
from headroom.core.specs.float8 import Float8Recipe, mx_scale_bytes
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import DTYPE_BYTES
from headroom.core.specs.stack import STACKS, Stack, get_stack

Kind = Literal["activation", "input", "parameter_copy"]
"""What a kept tensor is: an activation, an input (token ids, targets) or a parameter's copy (autocast's 16-bit
weights, save_on_cpu's host copies)."""
MatmulOp = Literal["mm", "addmm", "bmm", "attention"]
OpKind = Literal["gemm", "attention", "memory"]
"""How the time model prices a recorded op (headroom.core.timing.step_ops): by its GEMM shape, as an attention kernel, or by the
bytes it moves."""
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
        return _bytes(self.shape, self.dtype)


@dataclass(frozen=True, slots=True)
class TracedOp:
    """One op a forward runs (one kernel launch), as the time model needs it (headroom.core.timing.step_ops).

    ``memory``: an elementwise, norm, cast, copy or reduction op, priced by ``bytes``, what it writes, and
    ``read_bytes``, what it reads.
    ``gemm``: ``batch`` products of (m x k)(k x n) in ``dtype``. ``attention``: a fused attention kernel of
    ``flops`` (causal counted in full, headroom.core.memory.flops), ``causal`` when its mask lets it skip half of them.
    """

    name: str
    kind: OpKind
    dtype: str
    bytes: int = 0
    read_bytes: int = 0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    flops: int = 0
    causal: bool = False
    attention_core: bool = False
    """Made inside the attention core (QK^T, softmax, dropout, PV, or the fused kernel): what selective
    checkpointing reruns."""

    backward_moved: tuple[int, ...] | None = None
    """A memory-bound op whose backward is not one kernel moving twice its bytes: the bytes each of its backward
    kernels moves (a float8 cast's: the casts backward runs again, headroom.core.specs.float8)."""
    backward_only: bool = False
    """Forward runs no kernel for it; only its ``backward_moved`` kernels run (Transformer Engine's cast of a
    linear's output gradient, where the norm before it wrote the input's fp8 copy)."""

    def __post_init__(self) -> None:
        if self.kind == "gemm":
            object.__setattr__(self, "flops", 2 * self.m * self.n * self.k * self.batch)


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


@dataclass(slots=True)
class Sym:
    """A symbolic tensor: a storage, a shape and a dtype."""

    storage: int
    shape: tuple[int, ...]
    dtype: str
    name: str
    kind: Kind = "activation"
    storage_shape: tuple[int, ...] | None = None
    """The whole storage's shape when this is a view of part of it (a split): kept, the storage costs that."""


@dataclass(slots=True)
class Trace:
    """Replays the forward pass, collecting what each op saves under the active policy."""

    rules: DeviceRules
    amp: bool
    layer: int | None = None
    region: Literal["none", "checkpoint", "op-selective"] = "none"
    offloading: bool = False
    stack: Stack = STACKS["reference"]
    """Whose kernels and checkpointing (headroom.core.specs.stack)."""
    norm_offset: bool = False
    """The model's RMSNorm scales by 1 + weight in fp32 (headroom.core.specs.model.ModelSpec.norm_offset)."""
    float8: Float8Recipe | None = None
    """The FP8 recipe of the linears (headroom.core.specs.float8: the blocks', and the head's under MXFP8), or
    None."""
    compiled: bool = False
    """Each block runs compiled (TrainConfig.compile): inductor decomposes the block and its partitioner keeps,
    of what eager autograd would, the RMSNorms' inputs and fp32 rstd (as a fused norm does, on every device),
    and neither RoPE's tables nor SiLU's output, which backward recomputes (measured on the CPU: `in_compiled`)."""
    mm_count: int = 0
    """``aten.mm`` ops run so far in the current block."""
    kept: dict[int, SavedTensor] = field(default_factory=dict)
    weight_copies: dict[str, Sym] = field(default_factory=dict)
    fp8_copies: dict[int, Sym] = field(default_factory=dict)
    """Transformer Engine's fp8 copy of each tensor a converted linear reads, by the tensor's storage: one however
    many linears read it (q, k and v)."""
    normed: set[int] = field(default_factory=set)
    """Storages a norm made: the fused norm before a Transformer Engine linear writes their fp8 copy itself."""
    shared: dict[str, Sym] = field(default_factory=dict)
    """Tensors the model makes once per forward and hands every layer (a stack's RoPE tables)."""
    repeats: list[Repeat] = field(default_factory=list)
    ops: list[TracedOp | None] | None = None
    """When a list, every op the forward runs is recorded in it (headroom.core.timing.step_ops: the time model's enumeration);
    None (the ledger's traces): nothing is."""
    _op_at: dict[int, int] = field(default_factory=dict)
    """Where each recorded storage's op is in ``ops``."""
    attention_core: bool = False
    """Ops recorded now are the attention core's (``TracedOp.attention_core``)."""
    _next: int = 0

    # ---- bookkeeping -----------------------------------------------------------

    def new(self, name: str, shape: tuple[int, ...], dtype: str, kind: Kind = "activation",
            reads: float = 1.0) -> Sym:
        """A tensor an op makes. ``reads``: what the op reads, in tensors of this one's size (2 for a binary
        op's two operands); recorded in ``ops`` when they are."""
        self._next += 1
        sym = Sym(self._next, shape, dtype, self._named(name), kind)
        if self.ops is not None and kind != "input":  # token ids and targets come from the data loader
            self._op_at[sym.storage] = len(self.ops)
            written = _bytes(shape, dtype)
            self.ops.append(TracedOp(sym.name, "memory", dtype, bytes=written, read_bytes=round(reads * written),
                                     attention_core=self.attention_core))
        return sym

    def _named(self, name: str) -> str:
        """A tensor's or an op's name: a block's are ``block.``-prefixed."""
        return name if self.layer is None else f"block.{name}"

    def as_gemm(self, t: Sym, m: int, n: int, k: int, batch: int = 1, dtype: str | None = None) -> None:
        """``t`` was made by ``batch`` GEMMs (m x k)(k x n), not by a memory-bound op."""
        if self.ops is not None:
            self.ops[self._op_at[t.storage]] = TracedOp(t.name, "gemm", dtype or t.dtype, m=m, n=n, k=k, batch=batch,
                                                        attention_core=self.attention_core)

    def as_attention(self, out: Sym, heads: int, s: int, qk_dim: int, v_dim: int, *others: Sym | None) -> None:
        """``out`` and ``others`` (its log-sum-exp, RNG state) were made by one fused causal attention kernel over
        ``heads`` (sequences x heads) of ``s`` queries and keys: 2 s^2 (qk_dim + v_dim) FLOPs each, counted in
        full (headroom.core.memory.flops)."""
        if self.ops is None:
            return
        self.ops[self._op_at[out.storage]] = TracedOp(out.name, "attention", out.dtype, m=s, n=s, k=qk_dim,
                                                      batch=heads, flops=2 * heads * s * s * (qk_dim + v_dim),
                                                      causal=True, attention_core=True)
        self.unrecord(*others)

    def unrecord(self, *tensors: Sym | None) -> None:
        """``tensors`` were made by an op already recorded (a fused kernel's other outputs)."""
        if self.ops is not None:
            for t in tensors:
                if t is not None:
                    self.ops[self._op_at[t.storage]] = None

    def save(self, *tensors: Sym | None) -> None:
        """An op saves tensors for backward: kept unless inside a checkpointed region."""
        if self.region == "none":
            self.keep(*tensors)

    def keep(self, *tensors: Sym | None) -> None:
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

    def once(self, name: str, shape: tuple[int, ...], dtype: str) -> Sym:
        """A tensor made once per forward outside the blocks, the same storage for every layer that reads it."""
        if name not in self.shared:
            layer, self.layer = self.layer, None
            self.shared[name] = self.new(name, shape, dtype)
            self.layer = layer
        return self.shared[name]

    def keep_outside(self, *tensors: Sym) -> None:
        """Keep tensors as the model's, not a block's (what a checkpoint wrapper called from the model keeps)."""
        layer, self.layer = self.layer, None
        self.keep(*tensors)
        self.layer = layer

    def repeat_segments(self, template_start: int, start: int, count: int, size: int, x: Sym) -> Sym:
        """Keep for ``count`` segments of ``size`` layers from ``start`` what the one at ``template_start`` kept;
        return a new output of the last."""
        self.repeats.append(Repeat(template_start, start, size, count))
        self._next += 1
        return Sym(self._next, x.shape, x.dtype, x.name, x.kind)

    def matmul_output(self, t: Sym, op: MatmulOp = "mm") -> Sym:
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
    def checkpointed(self, *inputs: Sym, kind: Literal["checkpoint", "op-selective"] = "checkpoint") -> Iterator[None]:
        self.save(*inputs)  # non-reentrant checkpoint keeps its inputs
        outer, self.region = self.region, kind
        try:
            yield
        finally:
            self.region = outer

    # ---- ops: each rule is what autograd saves for that op ----------------------------

    def cast(self, x: Sym, dtype: str, name: str) -> Sym:
        return x if x.dtype == dtype else self.new(name, x.shape, dtype, reads=DTYPE_BYTES[x.dtype] / DTYPE_BYTES[dtype])

    def param(self, name: str, shape: tuple[int, ...], param_dtype: str) -> Sym | None:
        """A parameter an op saves: free (None), unless ``save_on_cpu`` copies it to the host."""
        if self.offloading and self.rules.offload_moves:
            return self.new(f"{name}_host", shape, param_dtype, "parameter_copy")
        return None

    def weight(self, name: str, shape: tuple[int, int], param_dtype: str) -> Sym | None:
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

    def linear(self, x: Sym, name: str, out_features: int, param_dtype: str, kept: Sym | None = None,
               rows: int | None = None, stacked: int = 1, bias: bool = False) -> Sym:
        """Saves its input (cast to bf16 per call under autocast) and its weight.

        ``kept``: what backward keeps instead of x (a sharded input gathered again in backward);
        ``rows``: the output's sequence length after a row-parallel reduce-scatter (sequence parallel);
        ``stacked``: x is the rows of that many linears of this shape (experts), one weight each;
        ``bias``: the layer has one, so torch runs it as one ``aten.addmm`` rather than an ``aten.mm``.
        """
        x_in = self.cast(x, "bf16", f"{name}.input_bf16") if self.amp else x
        saved = self.cast(kept, "bf16", f"{name}.input_bf16") if kept is not None and self.amp else kept or x_in
        shape = (*x.shape[:-2], rows if rows is not None else x.shape[-2], out_features)
        fp8 = self.float8 is not None and (self.layer is not None or self.float8.converts_head) and stacked == 1 \
            and self.float8.converts(x.shape[-1], out_features)
        if fp8 and self.float8.saves_fp8:
            # Transformer Engine keeps the input's fp8 copy, and the cached fp8 weight (static memory) for the weight
            self.save(self._te_input(name, saved, x_in, shape))
        else:
            self.save(saved, self.weight(name, (stacked * out_features, x.shape[-1]), param_dtype))
        if bias and self.amp and param_dtype != "bf16":  # autocast casts the bias too; addmm keeps none of it
            self.new(f"{name}.bias_bf16", (stacked * out_features,), "bf16", reads=2)
        if fp8 and not self.float8.saves_fp8:
            self._float8_casts(name, x_in, shape, (out_features, x.shape[-1]), param_dtype)
        out = self.new(f"{name}.out", shape, x_in.dtype)
        rows_in = _numel(x.shape[:-1])  # every row of x, before a row-parallel reduce-scatter
        # Stacked experts share the rows: with fewer rows than experts, at most one expert a row runs at all.
        groups = min(stacked, rows_in)
        self.as_gemm(out, -(-rows_in // groups), out_features, x.shape[-1], groups, "fp8" if fp8 else x_in.dtype)
        # torchao's float8 linear adds a bias after its matmul: an aten.mm either way
        return self.matmul_output(out, "addmm" if bias and not fp8 else "mm")

    def _float8_casts(self, name: str, x: Sym, out_shape: tuple[int, ...], weight_shape: tuple[int, int],
                      param_dtype: str) -> None:
        """A float8 linear's casts (headroom.core.specs.float8), as the time model prices them, one kernel each: its
        input's and its weight's forward; backward casts both again and the output's gradient twice. A float8 cast
        reads its 16-bit tensor twice (the amax, then the scaled cast), an MX one once (its blocks' amaxes are
        local) and writes a scale byte a block more; both write a byte an element. None is kept for backward."""
        if self.ops is None:
            return
        block = self.float8.block

        def cast(shape: tuple[int, ...], dtype: str) -> tuple[int, int]:
            """(bytes written, bytes read) of one cast of a tensor of ``shape`` and ``dtype``."""
            written = _numel(shape) + (-(-_numel(shape) // block) if block else 0)
            return written, (1 if block else 2) * _bytes(shape, dtype)

        x_in, weight, grad = cast(x.shape, x.dtype), cast(weight_shape, param_dtype), cast(out_shape, x.dtype)
        self.ops += [
            TracedOp(self._named(f"{name}.input_fp8"), "memory", "fp8", bytes=x_in[0], read_bytes=x_in[1],
                     backward_moved=(sum(x_in), sum(grad), sum(grad))),
            TracedOp(self._named(f"{name}.weight_fp8"), "memory", "fp8", bytes=weight[0], read_bytes=weight[1],
                     backward_moved=(sum(weight),)),
        ]

    def _te_input(self, name: str, source: Sym, x: Sym, out_shape: tuple[int, ...]) -> Sym:
        """A Transformer Engine linear's fp8 input (headroom.core.specs.float8), which backward keeps: ``source``'s
        copy (the sharded input under sequence parallelism, gathered again in fp8 in backward), made once
        however many linears read it. Its casts, as the time model prices them: forward, unless the norm that made
        ``source`` wrote it (delayed scaling), one pass writing the row- and column-wise copies (one under
        sequence parallelism, whose column-wise copy backward makes from the gathered input), after a pass for
        the amax (current scaling); backward, the output's gradient cast once, row- and column-wise, the same
        way."""
        copy = self.fp8_copies.get(source.storage)
        if copy is None:
            label = f"{source.name.removeprefix('block.')}_fp8"
            copy = self.fp8_copies[source.storage] = self.new(label, source.shape, "fp8")
            self.unrecord(copy)
            if self.float8.block:  # MXFP8: the column-wise copy's scales, kept with it
                scales = self.new(f"{label}.scale", (mx_scale_bytes(_numel(source.shape[:-1]), source.shape[-1],
                                                                    rowwise=False),), "uint8")
                self.unrecord(scales)
                self.save(scales)
            if self.ops is not None:
                self._te_input_cast(source, x)
        if self.ops is not None:
            moved = _numel(out_shape) * (DTYPE_BYTES[x.dtype] * self.float8.te_cast_reads + 2)
            if self.float8.block:
                moved += mx_scale_bytes(_numel(out_shape[:-1]), out_shape[-1])
            self.ops.append(TracedOp(self._named(f"{name}.grad_fp8"), "memory", "fp8", backward_moved=(moved,),
                                     backward_only=True))
        return copy

    def _te_input_cast(self, source: Sym, x: Sym) -> None:
        """The forward cast of a Transformer Engine linear's input (`_te_input`), recorded in ``ops``."""
        if self.float8.delayed and source.storage in self.normed:
            return  # the norm kernel writes the fp8 copy
        elements = _numel(source.shape)
        gathered = x.storage != source.storage  # sequence parallel: only the row-wise copy, gathered
        if self.float8.block:  # MXFP8 keeps its column-wise copy and gathers it as it is: no transpose
            gathered = False
        written = elements * (1 if gathered else 2)
        if self.float8.block:
            written += mx_scale_bytes(_numel(source.shape[:-1]), source.shape[-1])
        backward = (2 * _numel(x.shape),) if gathered else ()  # the gathered copy transposed for the weight gradient
        self.ops.append(TracedOp(self.fp8_copies[source.storage].name, "memory", "fp8", bytes=written,
                                 read_bytes=self.float8.te_cast_reads * elements * DTYPE_BYTES[source.dtype],
                                 backward_moved=backward))

    @property
    def in_compiled(self) -> bool:
        """The op runs in a compiled block (the embedding, the final norm, the head and the loss stay eager)."""
        return self.compiled and self.layer is not None

    def _norm_output(self, out: Sym) -> Sym:
        """A norm's output, remembered where a Transformer Engine linear may read it (`_te_input`)."""
        if self.float8 is not None and self.float8.saves_fp8:
            self.normed.add(out.storage)
        return out

    def layer_norm(self, x: Sym, name: str, param_dtype: str) -> Sym:
        """Saves its input, mean, rstd, weight and bias; the output is recomputed from them."""
        stats = "fp32" if x.dtype == "fp32" or self.rules.norm_stats_fp32 else x.dtype
        rows = x.shape[:-1] + (1,)
        h = (x.shape[-1],)
        mean, rstd = self.new(f"{name}.mean", rows, stats), self.new(f"{name}.rstd", rows, stats)
        self.save(x, mean, rstd, self.param(f"{name}.weight", h, param_dtype), self.param(f"{name}.bias", h, param_dtype))
        self.unrecord(mean, rstd)  # one kernel makes them with the output
        return self._norm_output(self.new(f"{name}.out", x.shape, x.dtype))

    def rms_norm(self, x: Sym, name: str, param_dtype: str) -> Sym:
        """RMSNorm: the stack's kernel (headroom.core.specs.stack); torch's is the fused one where the device has it.

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
        if kernel == "fused" or (kernel == "torch" and (self.rules.fused_rms_norm or self.in_compiled)):
            rstd = self.new(f"{name}.rstd", rows, "fp32")
            self.save(x, rstd, weight)
            self.unrecord(rstd)  # one kernel makes it with the output
            return self._norm_output(self.new(f"{name}.out", x.shape, x.dtype))
        upcast = self.cast(x, "fp32", f"{name}.input_fp32")
        # x^2, its mean and the epsilon added in place: made and dropped, never kept.
        self.new(f"{name}.squared", x.shape, "fp32")
        self.new(f"{name}.mean_square", rows, "fp32", reads=x.shape[-1])
        self.new(f"{name}.mean_square_eps", rows, "fp32")
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

    def dropout(self, x: Sym, name: str) -> Sym:
        """Saves the mask; the output is a new tensor. On CUDA one kernel (``native_dropout``) makes both, with a
        boolean mask; on a CPU the mask is drawn (``bernoulli_``), scaled in place, then multiplied in."""
        if self.rules.dropout_mask_bytes == 1:
            mask = self.new(f"{name}.mask", x.shape, "bool")
            self.save(mask)
            self.unrecord(mask)
        else:
            self.save(self.new(f"{name}.mask", x.shape, x.dtype))
            self.new(f"{name}.mask_scaled", x.shape, x.dtype)
        return self.new(f"{name}.out", x.shape, x.dtype, reads=2)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    return _numel(shape) * DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class Dims:
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
    def of(cls, spec: ModelSpec, cfg: TrainConfig) -> Dims:
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


def storage_view(x: Sym, shape: tuple[int, ...]) -> Sym:
    """A view of all or part of x's storage (a reshape, a split, a slice): kept, it costs the whole storage."""
    return Sym(x.storage, shape, x.dtype, x.name, x.kind, x.storage_shape or x.shape)


def per_head(x: Sym, heads: int, head_dim: int) -> Sym:
    """A projection's output (b, s, heads x head_dim) viewed per head: the same storage."""
    return storage_view(x, (*x.shape[:-1], heads, head_dim))
