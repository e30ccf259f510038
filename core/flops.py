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

from core.config import TrainConfig
from core.devices import device_rules
from core.errors import ConfigError
from core.model import ModelSpec
from core.precision import get_precision


def attention_forward_flops(batch: int, seq_len: int, heads: int, head_dim: int) -> int:
    """QK^T and PV forward: 2 b s^2 (a d) each, causal counted in full."""
    return 4 * batch * seq_len * seq_len * heads * head_dim


def layer_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> dict[str, int]:
    """Forward FLOPs of each matmul in one block, for b sequences of s tokens."""
    t, h, q, kv, f = micro_batch * seq_len, spec.hidden, spec.q_dim, spec.kv_dim, spec.ffn_hidden
    # Every query head attends over all s keys: 2 b s^2 (a x head_dim) per product (2 b s^2 h when
    # the heads are hidden / n_heads wide).
    attention = attention_forward_flops(micro_batch, seq_len, spec.n_heads, spec.head_dim) // 2
    flops = {
        "q_proj": 2 * t * h * q,
        "k_proj": 2 * t * h * kv,
        "v_proj": 2 * t * h * kv,
        "attn_scores": attention,
        "attn_values": attention,
        "o_proj": 2 * t * q * h,
        "mlp_up": 2 * t * h * f,
    }
    if spec.block == "llama":
        flops["mlp_gate"] = 2 * t * h * f
    flops["mlp_down"] = 2 * t * f * h
    return flops


def logits_forward_flops(spec: ModelSpec, micro_batch: int, seq_len: int) -> int:
    """The language-model head: (b s x h)(h x V)."""
    return 2 * micro_batch * seq_len * spec.hidden * spec.vocab_size


@dataclass(frozen=True, slots=True)
class StepFlops:
    """FLOPs of one micro-batch's forward and backward."""

    layer_forward: dict[str, int]
    """One block's forward, by matmul."""
    n_layers: int
    logits_forward: int
    recompute: int
    """Forward FLOPs run again by the checkpoint policy."""
    tokens: int

    @property
    def forward(self) -> int:
        return self.n_layers * sum(self.layer_forward.values()) + self.logits_forward

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
      segment's down projection (without dropout; residual dropout saves a
      mask, which needs that output);
    - selective: QK^T for the explicit or math-path attention (PV's inputs are
      saved, its output is not); a fused SDPA kernel reruns whole, QK^T and PV;
    - op-selective: no matmul (their outputs are cached); none and offload: 0.
    """
    layer = layer_forward_flops(spec, config.micro_batch, config.seq_len)
    policy = config.recompute
    if policy.recomputes_blocks:
        skipped = 0 if config.dropout > 0 else policy.segments(spec.n_layers) * layer["mlp_down"]
        return spec.n_layers * sum(layer.values()) - skipped
    if policy.recomputes_attention:
        fused = device_rules(device).fused_sdpa(config.attention, config.dropout,
                                                fp32=get_precision(config.precision).compute_dtype == "fp32",
                                                grouped=spec.n_kv_heads < spec.n_heads)
        return spec.n_layers * (layer["attn_scores"] + (layer["attn_values"] if fused else 0))
    return 0


def step_flops(spec: ModelSpec, config: TrainConfig, device: str = "cuda") -> StepFlops:
    """FLOPs of one micro-batch on ``device`` (the device decides which attention kernel runs)."""
    return StepFlops(
        layer_forward=layer_forward_flops(spec, config.micro_batch, config.seq_len),
        n_layers=spec.n_layers,
        logits_forward=logits_forward_flops(spec, config.micro_batch, config.seq_len),
        recompute=recompute_flops(spec, config, device),
        tokens=config.tokens,
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
