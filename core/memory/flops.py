"""FLOPs of a training step, by component.

Conventions (torch.utils.flop_counter.FlopCounterMode agrees with all three;
tests/test_torch_reference.py checks it):

- Only matrix multiplies count: a (m x k)(k x n) product is 2mkn FLOPs. Biases,
  norms, activations, softmax and the loss are elementwise and left out.
- Backward is twice forward for every matmul (one product for the input
  gradient, one for the weight gradient; for attention, two per operand pair).
- **Causal attention is counted in full**: QK^T and PV each cost 2 b s^2 h
  FLOPs per layer, as if unmasked. This is the PaLM/Megatron MFU convention and
  what FlopCounterMode reports. Kernels that skip masked tiles (FlashAttention)
  do about half that work, so their achieved FLOP/s look higher under this
  convention; nothing here discounts them.

Model FLOPs (MFU's numerator) are forward + backward. Hardware FLOPs (HFU's)
add what the checkpoint policy recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import device_rules
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import get_precision
from headroom.core.specs.stack import get_stack


def attention_forward_flops(batch: int, seq_len: int, heads: int, head_dim: int) -> int:
    """QK^T and PV forward: 2 b s^2 (a d) each, causal counted in full."""
    return 4 * batch * seq_len * seq_len * heads * head_dim


def attention_kernel_flops(batch: int, seq_len: int, heads: int, head_dim: int, causal: bool) -> int:
    """What an attention kernel's rate is measured by: ``attention_forward_flops``, halved when causal, as
    FlashAttention's benchmarks count it (Dao-AILab/flash-attention, benchmarks/benchmark_flash_attention.py,
    ``flops(..., causal)``): fused kernels skip the masked half, and counting it puts them above the device's
    peak (cuDNN on an H200: 1,022 TFLOP/s counted in full against a 989 peak). The accounting's own FLOPs
    (``layer_forward_flops``) count causal attention in full, as FlopCounterMode does."""
    full = attention_forward_flops(batch, seq_len, heads, head_dim)
    return full // 2 if causal else full


def layer_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int, moe: bool = False) -> dict[str, int]:
    """Forward FLOPs of each matmul in one block, for b sequences of s tokens; ``moe``: a mixture-of-experts
    block's (``moe_forward_flops`` in place of the dense MLP)."""
    t, h, q, kv, f = micro_batch * seq_len, spec.hidden, spec.q_dim, spec.kv_dim, spec.ffn_hidden
    # Every query head attends over all s keys: 2 b s^2 (a x head_dim) per product (2 b s^2 h when
    # the heads are hidden / n_heads wide).
    attention = attention_forward_flops(micro_batch, seq_len, spec.n_heads, spec.head_dim) // 2
    if spec.is_mla:
        flops = latent_attention_flops(spec, micro_batch, seq_len)
    else:
        flops = {
            "q_proj": 2 * t * h * q,
            "k_proj": 2 * t * h * kv,
            "v_proj": 2 * t * h * kv,
            "attn_scores": attention,
            "attn_values": attention,
            "o_proj": 2 * t * q * h,
        }
    if moe:
        return flops | moe_forward_flops(spec, t)
    flops["mlp_up"] = 2 * t * h * f
    if spec.block == "llama":
        flops["mlp_gate"] = 2 * t * h * f
    flops["mlp_down"] = 2 * t * f * h
    return flops


def latent_attention_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> dict[str, int]:
    """Multi-head latent attention's forward: its projections (headroom.core.specs.model.ModelSpec.latent_attention_shapes,
    each 2 t x in x out), QK^T over head_size-wide heads and PV over v_head_size-wide ones, causal in full."""
    t, h, a = micro_batch * seq_len, spec.hidden, spec.n_heads
    dqk, dr, dv, rq, rkv = spec.head_dim, spec.rope_head_size, spec.v_head_size, spec.q_lora_rank, spec.kv_lora_rank
    q = {"q_a_proj": 2 * t * h * rq, "q_b_proj": 2 * t * rq * a * dqk} if rq else {"q_proj": 2 * t * h * a * dqk}
    return q | {
        "kv_a_proj": 2 * t * h * (rkv + dr),
        "kv_b_proj": 2 * t * rkv * a * (dqk - dr + dv),
        "attn_scores": 2 * micro_batch * seq_len * seq_len * a * dqk,
        "attn_values": 2 * micro_batch * seq_len * seq_len * a * dv,
        "o_proj": 2 * t * a * dv * h,
    }


def moe_forward_flops(spec: ModelSpec, tokens: int) -> dict[str, int]:
    """Forward FLOPs of a mixture-of-experts MLP over ``tokens`` tokens: the router's logits (t x h)(h x E);
    each token's k experts, every one a gated MLP fe wide, so the experts' GEMMs together multiply t k rows
    dropless (however the router spreads them), or at a capacity factor every expert's padded capacity
    (ModelSpec.expert_rows); the shared expert and its gate over every token.
    Routing itself (softmax, top-k, permutation, the weighted sum) is elementwise."""
    t, h, fe, fs = tokens, spec.hidden, spec.expert_ffn, spec.shared_expert_ffn_hidden
    routed = spec.expert_rows(t)
    flops = {"router": 2 * t * h * spec.n_experts, "experts_gate": 2 * routed * h * fe,
             "experts_up": 2 * routed * h * fe, "experts_down": 2 * routed * fe * h}
    if fs:
        flops |= {"shared_gate": 2 * t * h * fs, "shared_up": 2 * t * h * fs, "shared_down": 2 * t * fs * h}
    if spec.shared_expert_gate:
        flops["shared_expert_gate"] = 2 * t * h
    return flops


def logits_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> int:
    """The language-model head: (b s x h)(h x V)."""
    return 2 * micro_batch * seq_len * spec.hidden * spec.vocab_size


@dataclass(frozen=True, slots=True)
class StepFlops:
    """FLOPs of one micro-batch's forward and backward."""

    layer_forward: dict[str, int]
    """One block's forward, by matmul (a dense block's in a mixture of experts)."""
    n_layers: int
    logits_forward: int
    recompute: int
    """Forward FLOPs run again by the checkpoint policy."""
    tokens: int
    moe_layer_forward: dict[str, int] | None = None
    """One mixture-of-experts block's forward, by matmul; None for a dense model."""
    moe_layers: int = 0
    """Blocks of the n_layers that are mixture-of-experts blocks."""

    @property
    def blocks_forward_by_matmul(self) -> dict[str, int]:
        """Every block's forward FLOPs by matmul: the dense blocks' and the mixture-of-experts blocks' summed
        by name (their attention shares names; the experts' and the dense MLP's do not)."""
        by_matmul: dict[str, int] = {}
        blocks = [(self.n_layers - self.moe_layers, self.layer_forward)]
        if self.moe_layer_forward:
            blocks.append((self.moe_layers, self.moe_layer_forward))
        for count, layer in blocks:
            for name, flops in layer.items():
                if count:
                    by_matmul[name] = by_matmul.get(name, 0) + count * flops
        return by_matmul

    @property
    def blocks_forward(self) -> int:
        """Every block's forward FLOPs."""
        return sum(self.blocks_forward_by_matmul.values())

    @property
    def forward(self) -> int:
        return self.blocks_forward + self.logits_forward

    @property
    def backward(self) -> int:
        return 2 * self.forward

    @property
    def model(self) -> int:
        """Model FLOPs (forward + backward), MFU's numerator."""
        return self.forward + self.backward

    @property
    def hardware(self) -> int:
        """Model FLOPs plus recompute, HFU's numerator."""
        return self.model + self.recompute

    @property
    def per_token(self) -> float:
        """Model FLOPs per token (about 6 x parameters + attention)."""
        return self.model / self.tokens


def recompute_flops(spec: ModelSpec, config: TrainConfig, device: str = "cuda") -> int:
    """Forward FLOPs a policy runs again during backward, as torch's non-reentrant
    checkpoint does it.

    That checkpoint stops recomputing as soon as every tensor the region saved
    has been rebuilt (``early stop``), so a region's trailing matmul whose
    output nothing in the region saves is not run again:

    - full and every-K: every block's forward, less the last block of each
      segment's last matmul, when nothing saves its output (``_unsaved_last_matmul``;
      without dropout: residual dropout saves a mask, which needs that output);
    - block-K: the first min(K, L) blocks of each pipeline chunk of L (a stage, or each of its virtual stages),
      each a segment of its own;
    - selective: QK^T for the explicit or math-path attention (PV's inputs are
      saved, its output is not); a fused SDPA kernel reruns whole, QK^T and PV;
    - op-selective: no matmul (their outputs are cached); none and offload: 0.

    Under the ``torchtitan`` and ``megatron`` stacks (headroom.core.specs.stack) full and every-K rerun every block whole (no
    early stop); under ``torchtitan`` op-selective reruns every second ``aten.mm`` of each block
    (``_sac_recomputed``) and, on a CPU, the fused attention kernel.
    """
    b, s = config.micro_batch, config.seq_len
    layer = layer_forward_flops(spec, b, s)
    policy, stack = config.recompute, get_stack(config.stack)
    if policy.kind == "block":
        return _block_recompute_flops(spec, config, early_stop=config.dropout == 0 and stack.early_stop)
    if policy.recomputes_blocks:
        blocks = step_flops(spec, config, device, recompute=0).blocks_forward
        if config.dropout > 0 or not stack.early_stop:
            return blocks
        size, n = policy.segment_layers(spec.n_layers), spec.n_layers
        segments = -(-n // size)  # each ends at layer min((k + 1) x size, n) - 1
        dense_ends = min(segments, spec.dense_layers // size) if spec.is_moe else segments
        moe_ends = segments - dense_ends
        return (blocks - dense_ends * (_unsaved_last_matmul(spec, b, s, False) if dense_ends else 0)
                - moe_ends * (_unsaved_last_matmul(spec, b, s, True) if moe_ends else 0))
    rules = device_rules(device)
    fused = rules.fused_sdpa(config.attention, config.dropout,
                             fp32=get_precision(config.precision).compute_dtype == "fp32",
                             grouped=spec.n_kv_heads < spec.n_heads,
                             narrow_values=spec.is_mla and spec.v_head_size != spec.head_dim)
    if policy.recomputes_attention:
        return spec.n_layers * (layer["attn_scores"] + (layer["attn_values"] if fused else 0))
    if policy.caches_matmuls and stack.every_other_mm:
        attention = layer["attn_scores"] + layer["attn_values"] \
            if fused and rules.device == "cpu" and not stack.caches_cpu_attention else 0
        return spec.n_layers * (_sac_recomputed(spec, layer, stack.fused_qkv) + attention)
    return 0


def _block_recompute_flops(spec: ModelSpec, config: TrainConfig, early_stop: bool) -> int:
    """block-K's recompute over the whole model: each pipeline chunk's first K blocks, each its own segment
    (`checkpointed_block_flops`)."""
    b, s, k = config.micro_batch, config.seq_len, config.recompute.every
    per_block = {moe: checkpointed_block_flops(spec, b, s, moe, early_stop) for moe in {False, spec.is_moe}}
    total, start = 0, 0
    for layers in config.chunk_layers(spec):
        total += sum(per_block[spec.is_moe_layer(i)] for i in range(start, start + min(k, layers)))
        start += layers
    return total


def checkpointed_block_flops(spec: ModelSpec, micro_batch: int, seq_len: int, moe: bool, early_stop: bool) -> int:
    """Forward FLOPs a block checkpointed on its own runs again: its whole forward (a dense or an experts' block),
    less its last matmul where torch's early stop skips it (``early_stop``: no dropout, and a stack whose checkpoint
    stops early; `_unsaved_last_matmul`)."""
    forward = sum(layer_forward_flops(spec, micro_batch, seq_len, moe).values())
    return forward - (_unsaved_last_matmul(spec, micro_batch, seq_len, moe) if early_stop else 0)


def _sac_recomputed(spec: ModelSpec, layer: dict[str, int], fused_qkv: bool) -> int:
    """FLOPs of the matmuls of one block that torchtitan's per-op checkpointing recomputes: every second
    ``aten.mm``, counting in forward order the linears without a bias (with one, torch runs an ``aten.addmm``,
    which it caches); ``fused_qkv``: q, k and v are one matmul."""
    qkv_bias, other_bias = spec.bias in ("qkv", "all"), spec.bias == "all"
    mlp = ("mlp_gate", "mlp_up", "mlp_down") if spec.block == "llama" else ("mlp_up", "mlp_down")
    if spec.is_mla:
        attention = [((name,), False) for name in layer if name.endswith("_proj")]
    else:
        qkv = [(("q_proj", "k_proj", "v_proj"), qkv_bias)] if fused_qkv else [
            ((name,), qkv_bias) for name in ("q_proj", "k_proj", "v_proj")]
        attention = [*qkv, (("o_proj",), other_bias)]
    order = [*attention, *(((name,), other_bias) for name in mlp)]
    mms = [names for names, bias in order if not bias]
    return sum(layer[name] for names in mms[1::2] for name in names)


def _unsaved_last_matmul(spec: ModelSpec, micro_batch: int, seq_len: int, moe: bool) -> int:
    """Forward FLOPs of a block's last matmul when nothing in the block saves its output, so that a
    recomputing checkpoint stops before it: the MLP's down projection; a mixture of experts' shared down
    projection. Saved, hence run again: under a post-MLP norm (it keeps its input), a shared expert's
    sigmoid gate (the product keeps both factors) or, without a shared expert, the last expert's routing
    weights (likewise)."""
    if spec.post_norms:
        return 0
    if not moe:
        return layer_forward_flops(spec, micro_batch, seq_len)["mlp_down"]
    return 0 if spec.shared_expert_gate else moe_forward_flops(spec, micro_batch * seq_len).get("shared_down", 0)


def step_flops(spec: ModelSpec, config: TrainConfig, device: str = "cuda", recompute: int | None = None) -> StepFlops:
    """FLOPs of one micro-batch on ``device`` (the device decides which attention kernel runs).
    ``recompute``: the recomputed FLOPs when already known."""
    b, s = config.micro_batch, config.seq_len
    return StepFlops(
        layer_forward=layer_forward_flops(spec, b, s),
        n_layers=spec.n_layers,
        logits_forward=logits_forward_flops(spec, b, s),
        recompute=recompute_flops(spec, config, device) if recompute is None else recompute,
        tokens=config.tokens,
        moe_layer_forward=layer_forward_flops(spec, b, s, moe=True) if spec.is_moe else None,
        moe_layers=spec.moe_layers,
    )


def _utilization(flops: float, step_time_s: float, peak_flop_per_s: float) -> float:
    if step_time_s <= 0 or peak_flop_per_s <= 0:
        raise ConfigError(
            f"step time ({step_time_s!r} s) and peak ({peak_flop_per_s!r} FLOP/s) must be positive"
        )
    return flops / step_time_s / peak_flop_per_s


def mfu(model_flops: float, step_time_s: float, peak_flop_per_s: float) -> float:
    """Model FLOPs utilisation: model FLOPs / time / dense peak (recompute not counted)."""
    return _utilization(model_flops, step_time_s, peak_flop_per_s)


def hfu(hardware_flops: float, step_time_s: float, peak_flop_per_s: float) -> float:
    """Hardware FLOPs utilisation: like MFU, but recomputed FLOPs count."""
    return _utilization(hardware_flops, step_time_s, peak_flop_per_s)
