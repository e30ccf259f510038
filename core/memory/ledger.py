"""The activation ledger: every tensor a training step keeps for backward.

Published formulas (sbh(34 + 5as/h), Korthikanti et al. 2022) describe one
block with fused 16-bit kernels. The decoder the agent trains (agent/model.py)
saves other tensors: LayerNorm statistics, fp32 copies under autocast, the
clones a batched matmul makes of non-contiguous heads, flash attention's
log-sum-exp, dropout masks in the input's dtype on CPU. So the ledger replays
that model's forward symbolically, op by op (core/memory/forward_trace.py), with each
op's rule for what it saves (headroom.core.memory.trace.Trace), and applies the checkpoint
policy the way ``torch.utils.checkpoint`` does:

- inside a checkpointed region nothing is kept but the region's inputs;
- under ``op-selective`` a region also keeps the outputs of its matmul and
  fused-attention ops (what ``create_selective_checkpoint_contexts`` caches);
- under ``offload`` the blocks' saved tensors live in host memory (on a device
  where ``save_on_cpu`` moves anything, i.e. CUDA).

Tensors are identified by storage, as the probe dedupes them: three linear
layers saving the same LayerNorm output cost one tensor. The ledger is checked
against agent/probe.py (autograd's own saved tensors) in tests/test_ledger.py;
core/specs/devices.py says which device facts were measured where.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from headroom.core.errors import ConfigError
from headroom.core.memory.attention_trace import masked_sdpa_refusal
from headroom.core.memory.forward_trace import new_trace, trace_block, trace_forward
from headroom.core.memory.pipeline import RankKind, first_rank
from headroom.core.memory.trace import Dims, Kind, Repeat, SavedTensor
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import DeviceRules, device_rules
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.stack import get_stack

PROBABILITIES = ("log_softmax", "loss.softmax")
"""Names of the loss's fp32 probabilities over the vocabulary kept for backward: the log-probabilities, or the softmax
of Megatron's cross-entropy."""


@dataclass(frozen=True, slots=True)
class Ledger:
    traced: tuple[SavedTensor, ...]
    """The tensors traced op by op: the first segments, the embedding, head and loss."""
    n_layers: int
    loss_gradient_bytes: int
    """Backward's first moment, on top of everything kept: the gradients of the log-probs (from
    nll_loss) and of the logits (from log_softmax), fp32 over the vocabulary, while the log-probs
    themselves are still alive (measured on an H200). Other stacks' cross-entropies (headroom.core.specs.stack) add
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
    """Context parallelism: ring attention's buffers in one layer's backward, on top of what is kept
    (`_ring_buffer_bytes`)."""
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


def chunk_device_bytes(ledger: Ledger, first_chunk_layers: int, embedding_tensors: int,
                       kinds: tuple[Kind, ...] = ("activation", "input")) -> tuple[int, int]:
    """The device bytes of ``kinds`` one micro-batch keeps on a rank of two chunks (zbv), split at its block
    ``first_chunk_layers``: each block's to its chunk; the first ``embedding_tensors`` traced (the embedding's,
    traced first: 0 on a rank without it) to the first chunk; any other tensor no block keeps to the chunk of
    the block traced before it, or, after the last block or where there is none, to the second (the final
    norm's, head's and loss's)."""
    def kept(t: SavedTensor) -> bool:
        return t.location == "device" and t.kind in kinds

    split = [0, 0]
    by_layer: dict[int, int] = {}
    for t in ledger.traced:
        if t.layer is not None and kept(t):
            by_layer[t.layer] = by_layer.get(t.layer, 0) + t.bytes
    for layer, n in by_layer.items():
        split[layer >= first_chunk_layers] += n
    for r in ledger.repeats:  # later segments keep what their template kept
        for start in range(r.start, r.end, r.size):
            for offset in range(r.size):
                split[start + offset >= first_chunk_layers] += by_layer.get(r.template + offset, 0)
    traced = ledger.traced
    last_block = max((i for i, t in enumerate(traced) if t.layer is not None), default=-1)
    chunk = 0
    for i, t in enumerate(traced):  # in the order forward made them: later segments are references to these
        if t.layer is not None:
            chunk = int(t.layer >= first_chunk_layers)
        elif kept(t):
            split[0 if i < embedding_tensors else 1 if i > last_block else chunk] += t.bytes
    return split[0], split[1]


def activation_ledger(spec: ModelSpec, config: TrainConfig, device: str = "cuda",
                      rules: DeviceRules | None = None, rank: RankKind | None = None) -> Ledger:
    """Every tensor one micro-batch keeps for backward on one rank of the layout, on ``device``.

    ``rank``: the pipeline stage (headroom.core.memory.pipeline); by default the first (the only one without a
    pipeline). Tensor, sequence and context parallelism shrink the shapes (headroom.core.memory.trace.Dims).
    ``rules`` replaces the device's (headroom.core.specs.devices), e.g. to predict SDPA forced onto its math path.
    """
    config.check_model(spec)
    rules = rules or device_rules(device)
    rank = rank or first_rank(config.layout, spec.n_layers, config.stack)
    one_micro_batch = rank.one_micro_batch
    if config.recompute.kind != "block":  # only block-K keeps by chunk: the other policies share one ledger
        one_micro_batch = replace(one_micro_batch, chunks=())
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
    stays: it decides which experts' weights the rank copies (the fewest dp that ep allows keeps it valid)."""
    layout = replace(config.layout.fewest_data_parallel(), zero=3 if config.fsdp_mixed_precision else 0,
                     schedule="1f1b", virtual_stages=1)
    return replace(config, layout=layout) if layout != config.layout else config


@functools.lru_cache(maxsize=2048)
def _cached_ledger(spec: ModelSpec, config: TrainConfig, rules: DeviceRules, rank: RankKind) -> Ledger:
    if config.recipe.autocast and not rules.autocast:
        raise ConfigError(f"amp-bf16 needs autocast, which the {rules.device} device does not have")
    if rules.fused_attention_mask is None and (refusal := masked_sdpa_refusal(spec, config)):
        raise ConfigError(refusal)
    tr = trace_forward(spec, config, rules, rank)
    d = Dims.of(spec, config)
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
    ring = _ring_buffer_bytes(config, d) if config.layout.cp > 1 else 0
    return Ledger(tuple(tr.kept.values()), rank.layers, repeats=tuple(tr.repeats), loss_gradient_bytes=loss_gradient,
                  recompute_bytes=_recompute_bytes(spec, config, rules, freed_by_blocks, rank.chunk_layers),
                  forward_transient_bytes=forward_transient, ring_buffer_bytes=ring)


def _ring_buffer_bytes(config: TrainConfig, d: Dims) -> int:
    """Ring attention's buffers in one layer's backward, beyond what is kept (headroom.core.timing.comm's
    exchanges, counted from the implementations, not measured). kv: this rank's K and V of one layer in the
    compute dtype. Transformer Engine's ring: the K and V chunk in use and the one arriving, with their
    gradients (4 kv); its all-gather: K and V of the whole sequence and their gradients (2 cp kv). torch's: the
    K and V in use and arriving (2 kv) or, gathered, the whole sequence's (cp kv), beside the fp32 gradients of
    K and V being summed and arriving and of Q being summed (``convert_to_f32``)."""
    kv = 2 * d.b * d.s * d.kv
    kv_bytes, cp = kv * config.recipe.activation_bytes, config.layout.cp
    ring = config.cp_comm == "ring"
    if get_stack(config.stack).context_parallel == "transformer-engine":
        return 4 * kv_bytes if ring else 2 * cp * kv_bytes
    return (2 if ring else cp) * kv_bytes + 2 * kv * 4 + d.b * d.s * d.q * 4


def _fused_linear_chunk_bytes(d: Dims, amp: bool, input_bytes: int, device: str) -> int:
    """Liger's fused linear cross-entropy at its forward's peak, beyond what it keeps
    (``ops/fused_linear_cross_entropy.py``, liger-kernel 0.8).

    Its loop over chunks of ``next_pow2(ceil(tokens / ceil(V / h)))`` rows (at most every token) makes one chunk
    of logits in the matmul's dtype (16-bit under autocast, else the input's) and, while it lives, the chunk of the
    input's gradient, then the weight's gradient: accumulated in place on a CUDA device for 16-bit logits
    (``addmm``), else through a whole ``V x h`` product (and its fp32 copy for 16-bit logits). Beside them, the
    per-token fp32 losses. Under autocast the head weight's 16-bit copy is in autocast's cache with every other
    weight's (headroom.core.memory.estimate), not here.
    """
    tokens, h, vocab = d.tokens, d.h, d.vocab
    rows = min(tokens, 1 << (-(-tokens // -(-vocab // h)) - 1).bit_length())
    matmul = 2 if amp else input_bytes
    if device == "cuda" and matmul == 2:
        weight_gradient = 0
    else:
        weight_gradient = vocab * h * (matmul + (4 if matmul != 4 else 0))
    return rows * vocab * matmul + max(rows * h * matmul, weight_gradient) + 4 * tokens


def _recompute_bytes(spec: ModelSpec, config: TrainConfig, rules: DeviceRules, loss_kept: int,
                     chunks: tuple[int, ...]) -> int:
    """What backward brings back at once, on top of what forward kept, once the loss's tensors are freed.

    A checkpointed segment or an offloaded block: what its blocks keep without
    recompute (full, every-K, op-selective, offload, and block-K where it checkpoints every block of the rank), or
    one attention core (selective). What the loss kept (``loss_kept``: its probabilities over the vocabulary, or Liger's two
    gradients) is freed by the time a block's backward runs. ``chunks``: the rank's blocks, chunk by chunk.
    """
    policy = config.recompute
    if not policy.recomputes and not (policy.offloads and rules.offload_moves):
        return 0
    layers = sum(chunks)
    if policy.kind == "block" and all(policy.recomputed_layers(n) < n for n in chunks):
        # block-K: backward reaches a chunk's checkpointed blocks after the chunk's blocks kept whole, whose
        # activations it has freed by then, each as large as what one recompute brings back.
        return 0
    # The largest block: a mixture of experts' last (a routed one), or any.
    layer = spec.n_layers - 1
    block = _block_bytes(spec, config, rules, "none", layer)
    if spec.dense_layers:
        block = max(block, _block_bytes(spec, config, rules, "none", 0))
    if policy.recomputes_blocks:
        segment = policy.segment_layers(layers) * block
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
    d = Dims.of(spec, cfg)
    tr = new_trace(spec, cfg, rules, layer)
    x = tr.new("input", (d.b, d.rows, d.h), param_dtype)
    trace_block(tr, spec, d, cfg, x, param_dtype)
    return sum(t.bytes for t in tr.kept.values() if t.kind == "activation")
