"""The traced ledger: what a HuggingFace model keeps for backward, from its ``config.json`` alone.

transformers builds the model from its config on the meta device (no
weights, no memory), one forward of a micro-batch runs under the saved-tensor
probe (headroom.agent.probe), and every tensor kept for backward is listed with its
layer. Any architecture transformers implements can be traced, whether or
not the analytic ledger (headroom.core.memory.ledger) models it.

Meta has no attention kernels: ``F.scaled_dot_product_attention`` falls back
to its math path there, which keeps the attention probabilities (b a s^2).
The trace routes each call to the fused kernel the target device would run,
whose meta implementation has the real kernel's outputs, so autograd keeps
what that kernel keeps (q, k, v, output, log-sum-exp) under the device's
rules (headroom.core.specs.devices): on a CPU the flash kernel (any dtype, grouped k/v
heads, an explicit mask; dropout sends it to math), on CUDA flash for 16-bit
inputs (fp32 runs math), with dropout inside the kernel. Which CUDA kernel
takes an explicit mask (transformers' sliding-window layers) has not been
measured: traced on CUDA's rules, such a call stops the trace with that
reason. Traced with the CPU's rules, the ledger equals a real CPU forward of
the same model byte for byte (tests/test_hf_trace.py).

``--attention standard`` builds the model with transformers' eager attention
instead (softmax(QK^T)V written out, Gemma 2's soft-capping included), which
keeps the same tensors on every device. Gemma 2 has no SDPA attention: its
flash attention is FlashAttention 2's, which needs CUDA, so it is traced
with ``--attention standard`` only.

The model runs in one dtype: fp32, or bf16 for the bf16 recipes. Autocast
has no meta implementation, so ``amp-bf16`` cannot be traced.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from headroom.agent.ledger_check import DTYPE_NAMES
from headroom.agent.probe import ProbedTensor, ProbeResult, probe
from headroom.core.errors import ConfigError
from headroom.core.memory.ledger import Ledger
from headroom.core.memory.trace_limits import trace_refusal
from headroom.core.specs.config import Attention, TrainConfig
from headroom.core.specs.devices import DEVICE_RULES, DeviceRules
from headroom.core.specs.precision import get_precision

MASKED_CUDA_SDPA = ("transformers hands SDPA an explicit mask here (a sliding-window layer, the sequence at least as "
                    "long as the window): which CUDA kernel takes it, and what that keeps, has not been measured on a "
                    "GPU yet; trace --attention standard (transformers' eager attention), or with --device cpu")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_LAYER = re.compile(r"\.(?:layers|h|layer|blocks)\.(\d+)(?:\.|$)")
"""A decoder layer's index in a module path: model.layers.3.mlp (Llama and most), transformer.h.3 (GPT-2)."""


@dataclass(frozen=True, slots=True)
class TracedTensor:
    """One storage kept for backward, in the analytic ledger's JSON shape (headroom.core.memory.trace.SavedTensor)."""

    name: str
    """The submodule that saved it and the op that made it, e.g. ``model.layers.0.mlp.act_fn.silu``."""
    shape: tuple[int, ...]
    dtype: str
    location: str
    kind: str
    layer: int | None
    bytes: int
    """The whole storage (a saved view costs its base)."""


@dataclass(frozen=True, slots=True)
class TracedLedger:
    model: str
    device: str
    """Whose rules the attention kernels followed: ``cpu`` or ``cuda``."""
    tensors: tuple[TracedTensor, ...]
    n_layers: int

    @property
    def saved_bytes(self) -> int:
        """Activations and token ids kept for backward (what the analytic ledger's ``saved_bytes`` counts)."""
        return sum(t.bytes for t in self.tensors if t.kind in ("activation", "input"))

    def layer_bytes(self, layer: int | None) -> int:
        return sum(t.bytes for t in self.tensors if t.layer == layer and t.kind in ("activation", "input"))

    def to_dict(self) -> dict:
        return {"model": self.model, "device": self.device, "saved_bytes": self.saved_bytes,
                "ledger": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "location": t.location,
                            "kind": t.kind, "layer": t.layer, "bytes": t.bytes} for t in self.tensors]}

    @classmethod
    def from_dict(cls, entry: dict, n_layers: int) -> TracedLedger:
        """A traced ledger back from ``to_dict``'s JSON (which leaves the model's depth out)."""
        tensors = tuple(TracedTensor(**{**t, "shape": tuple(t["shape"])}) for t in entry["ledger"])
        return cls(model=entry["model"], device=entry["device"], tensors=tensors, n_layers=n_layers)


class _FusedAttention(TorchFunctionMode):
    """Sends ``F.scaled_dot_product_attention`` to the fused kernel the device's rules say runs there
    (`DeviceRules.fused_sdpa`, the analytic ledger's own test): on a CPU flash, an explicit mask included; on
    CUDA flash for 16-bit inputs, memory-efficient attention for fp32 (equal head counts) and for value heads
    narrower than query and key heads, and a masked call refused (not measured). Anything else takes SDPA's
    math path, as on the device."""

    def __init__(self, rules: DeviceRules) -> None:
        super().__init__()
        self.rules = rules

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        call = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"), args)) | kwargs
        q, k, v = call["query"], call["key"], call["value"]
        mask, p = call.get("attn_mask"), call.get("dropout_p", 0.0)
        causal, scale = call.get("is_causal", False), call.get("scale")
        fp32, narrow = q.dtype == torch.float32, v.shape[-1] != q.shape[-1]
        if mask is not None and self.rules.fused_attention_mask is None:
            raise ConfigError(MASKED_CUDA_SDPA)
        if not self.rules.fused_sdpa("flash", p, fp32=fp32, grouped=k.shape[-3] != q.shape[-3], narrow_values=narrow,
                                     masked=mask is not None):
            return func(*args, **kwargs)
        ops = torch.ops.aten
        if self.rules.device == "cpu":
            if mask is not None and mask.dtype == torch.bool:  # SDPA's own conversion to an additive mask
                mask = torch.where(mask.logical_not(), torch.full((), -torch.inf, dtype=q.dtype, device=q.device),
                                   torch.zeros((), dtype=q.dtype, device=q.device))
            return ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, p, causal, attn_mask=mask, scale=scale)[0]
        if fp32 or narrow:
            return ops._scaled_dot_product_efficient_attention(q, k, v, None, True, p, causal, scale=scale)[0]
        return ops._scaled_dot_product_flash_attention(q, k, v, p, causal, scale=scale)[0]


def build_model(config: dict, dtype: torch.dtype, device: str | torch.device = "meta",
                attention: Attention = "flash") -> torch.nn.Module:
    """transformers' causal LM for ``config`` (a parsed ``config.json``), in ``dtype``, without weights on meta,
    with its SDPA attention (``flash``) or its eager one (``standard``)."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("tracing a model needs HuggingFace transformers: pip install 'headroom[frameworks]'") from None
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    model_type = config.get("model_type")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as err:
        raise ConfigError(f"model_type {model_type!r}: transformers {transformers.__version__} cannot build it "
                          f"({str(err).splitlines()[0]}); the analytic ledger (without --trace) may still account for it") from None
    implementation = {"flash": "sdpa", "standard": "eager"}[attention]
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype,
                                                                  attn_implementation=implementation)
        except ValueError as err:
            if "scaled_dot_product_attention" in str(err):  # Gemma 2: SDPA cannot soft-cap its scores
                raise ConfigError(f"model_type {model_type!r}: transformers cannot run its attention on SDPA, and "
                                  "its flash attention (FlashAttention 2) needs CUDA, not the meta device: trace "
                                  "--attention standard (transformers' eager attention)") from None
            raise ConfigError(f"model_type {model_type!r}: transformers has no causal language model for it "
                              f"({str(err).splitlines()[0]})") from None
    return model.train()


def trace(config: dict, name: str, train: TrainConfig, device: str = "cuda", *, seed: int = 0) -> TracedLedger:
    """What one forward of ``train``'s micro-batch keeps for backward on meta, under ``device``'s attention
    rules (``cpu``, ``cuda``, or ``meta``'s own: the math path)."""
    if (refusal := trace_refusal(train)) is not None:
        raise ConfigError(refusal)
    dtype = DTYPES[get_precision(train.precision).compute_dtype]
    rules = DEVICE_RULES[device]
    torch.manual_seed(seed)
    model = build_model(config, dtype, attention=train.attention)
    if str(train.recompute) == "full":
        checkpoint_every_layer(model)
    vocab = model.get_input_embeddings().num_embeddings
    tokens = torch.randint(0, vocab, (train.micro_batch, train.seq_len), device="meta")

    def forward() -> torch.Tensor:
        with _FusedAttention(rules), _one_sequence_per_row():
            return model(input_ids=tokens, labels=tokens, use_cache=False).loss

    try:
        probed = probe(model, forward)
    except (RuntimeError, NotImplementedError) as err:
        # Data-dependent code (.item() on meta), or a kernel that refuses the dtype (transformers' grouped
        # expert matmul wants bf16): the model's own forward, not the trace, says no.
        raise ConfigError(f"{name} cannot be traced at --precision {train.precision} on the meta device: "
                          f"transformers' forward stopped with {str(err).splitlines()[0]!r}; the analytic ledger "
                          "(without --trace) still accounts for it") from None
    return ledger_of(probed, name, device, model)


def ledger_of(probed: ProbeResult, name: str, device: str, model: torch.nn.Module) -> TracedLedger:
    """The probe's tensors kept for backward (parameters left out), each with its decoder layer."""
    layers = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", 0)
    kept = tuple(_traced(t) for t in probed.tensors if t.kind != "parameter")
    return TracedLedger(model=name, device=device, tensors=kept, n_layers=layers)


@contextlib.contextmanager
def _one_sequence_per_row() -> Iterator[None]:
    """Training without a cache, transformers looks for packed sequences in the positions, a question it
    answers with ``.item()``, which meta cannot. The trace's rows are one sequence each (positions 0 to
    s - 1), for which the answer is None: given here."""
    try:
        from transformers import masking_utils
    except ImportError:  # an older transformers, without the check
        yield
        return
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        yield
        return
    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def checkpoint_every_layer(model: torch.nn.Module) -> None:
    """transformers' own activation checkpointing, non-reentrant (renamed in transformers 5)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _traced(t: ProbedTensor) -> TracedTensor:
    match = _LAYER.search("." + t.module)
    return TracedTensor(name=f"{t.module or 'model'}.{t.op}", shape=t.shape, dtype=DTYPE_NAMES.get(t.dtype, t.dtype),
                        location="device", kind=t.kind, layer=int(match.group(1)) if match else None, bytes=t.nbytes)


def differences(traced: TracedLedger, analytic: Ledger) -> list[str]:
    """Where the two ledgers part, by part of the model: the bytes and the tensors only one of them keeps.

    Tensors are matched by dtype and size, not shape: a linear's output is (b s, f) to one ledger and
    (b, s, f) to the other, k is (b, s, kv d) or (b, kv, s, d). Layers that part alike are named once."""
    def kept(tensors, layer) -> tuple[Counter, dict]:
        count: Counter = Counter()
        shapes: dict = {}
        for t in tensors:
            if t.layer == layer and t.kind in ("activation", "input"):
                key = (t.dtype, t.bytes)
                count[key] += 1
                shapes.setdefault(key, tuple(t.shape))
        return count, shapes

    groups: dict[tuple, list[int | None]] = {}
    for layer in [*range(traced.n_layers), None]:
        (mine, my_shapes), (theirs, their_shapes) = kept(traced.tensors, layer), kept(analytic.tensors, layer)
        if mine != theirs:
            key = (tuple(sorted((dtype, size, my_shapes[dtype, size], n) for (dtype, size), n in (mine - theirs).items())),
                   tuple(sorted((dtype, size, their_shapes[dtype, size], n)
                                for (dtype, size), n in (theirs - mine).items())))
            groups.setdefault(key, []).append(layer)
    lines = []
    for (only_traced, only_analytic), layers in groups.items():
        extra = sum(size * n for _, size, _, n in only_traced) - sum(size * n for _, size, _, n in only_analytic)
        lines.append(f"{_where(layers)}: the trace keeps {extra:+,} bytes; only traced: {_listed(only_traced)}; "
                     f"only analytic: {_listed(only_analytic)}")
    return lines


def _listed(items) -> str:
    return ", ".join(f"{'x'.join(map(str, shape)) or 'scalar'} {dtype}" + (f" (x{n})" if n > 1 else "")
                     for dtype, _, shape, n in items) or "nothing"


def _where(layers: list[int | None]) -> str:
    numbers = [n for n in layers if n is not None]
    parts = []
    if len(numbers) == 1:
        parts.append(f"layer {numbers[0]}")
    elif numbers:
        contiguous = numbers == list(range(numbers[0], numbers[-1] + 1))
        parts.append(f"layers {numbers[0]}-{numbers[-1]}" if contiguous else "layers " + ", ".join(map(str, numbers)))
    if None in layers:
        parts.append("embedding, head and loss")
    return " and ".join(parts)
