"""What PyTorch saves for backward differs by device: the facts the ledger needs.

Each field says where it was measured. "Measured" means agent/probe.py on
torch 2.13.0 (CPU build, x86-64) reported it; tests/test_ledger.py keeps the
measurement and the ledger in agreement. The CUDA column comes from the
kernels' documented behaviour (FlashAttention and memory-efficient SDPA
kernels, ``native_dropout``'s bool mask, autocast's fp32 op list) and is
checked on a GPU by the training-step benchmark, not by the CPU test suite.
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRules:
    device: str
    dropout_mask_bytes: int | None
    """Bytes per element of a dropout mask; None: the input's dtype (CPU, meta: measured)."""
    norm_stats_fp32: bool
    """LayerNorm keeps mean/rstd in fp32 for 16-bit input (meta: measured; CPU keeps them in bf16)."""
    fused_attention: bool
    """SDPA runs a fused kernel (CPU flash without dropout: measured); meta falls back to the math path."""
    fused_attention_dropout: bool
    """The fused kernel also does dropout (CUDA); on CPU dropout sends SDPA to the math path (measured)."""
    fused_attention_fp32_gqa: bool
    """A fused kernel takes fp32 inputs with grouped key/value heads (CPU flash: measured). On CUDA none
    does: flash and cuDNN need 16-bit inputs, memory-efficient attention equal head counts, so SDPA runs
    its math path (measured on an H200, torch 2.11)."""
    fused_attention_rng_state: bool
    """The fused kernel keeps its philox seed and offset, two int64 scalars (CUDA: measured on an H200
    for cuDNN and memory-efficient attention; flash keeps 8 bytes more, not modelled)."""
    autocast: bool
    """Autocast exists for this device (not for meta)."""
    autocast_softmax_fp32: bool
    """Autocast runs softmax in fp32 (CUDA's fp32 op list; CPU's list keeps bf16: measured)."""
    offload_moves: bool
    """``save_on_cpu`` moves saved tensors off the device (on CPU they stay where they are)."""
    fused_attention_narrow_values: bool
    """A fused kernel takes value heads narrower than query and key heads (latent attention): CPU flash does
    not, SDPA runs its math path (measured); on CUDA memory-efficient attention does (its documented support;
    not yet measured: the GPU check probes it)."""
    fused_attention_mask: bool | None
    """A fused kernel takes an explicit mask (transformers' sliding-window layers under SDPA): CPU flash does and
    keeps the mask, made additive in the inputs' dtype (measured). On CUDA flash does not; which kernel does
    (memory-efficient attention, cuDNN) and what it keeps has not been measured on a GPU: None, refused until
    the GPU check's probe (headroom.agent.check.masked_sdpa) has run there."""
    fused_rms_norm: bool
    """RMSNorm runs ``_fused_rms_norm``, whose backward keeps only input, fp32 rstd and weight (CUDA);
    CPU and meta run the composite that keeps the fp32 normalised tensor too (measured)."""

    def fused_sdpa(self, attention: str, dropout: float, fp32: bool = False, grouped: bool = False,
                   narrow_values: bool = False, masked: bool = False) -> bool:
        """Does ``flash`` attention run as one fused kernel here (else SDPA's math path)?

        ``fp32``: the attention inputs are fp32; ``grouped``: fewer key/value heads than query heads;
        ``narrow_values``: value heads narrower than query and key heads; ``masked``: an explicit mask.
        """
        return (
            attention == "flash" and self.fused_attention
            and (dropout == 0 or self.fused_attention_dropout)
            and (not (fp32 and grouped) or self.fused_attention_fp32_gqa)
            and (not narrow_values or self.fused_attention_narrow_values)
            and (not masked or bool(self.fused_attention_mask))
        )


DEVICE_RULES: dict[str, DeviceRules] = {
    "cpu": DeviceRules(
        device="cpu", dropout_mask_bytes=None, norm_stats_fp32=False, fused_attention=True,
        fused_attention_dropout=False, autocast=True, autocast_softmax_fp32=False,
        offload_moves=False, fused_rms_norm=False, fused_attention_fp32_gqa=True, fused_attention_rng_state=False,
        fused_attention_narrow_values=False, fused_attention_mask=True,
    ),
    "meta": DeviceRules(
        device="meta", dropout_mask_bytes=None, norm_stats_fp32=True, fused_attention=False,
        fused_attention_dropout=False, autocast=False, autocast_softmax_fp32=False,
        offload_moves=False, fused_rms_norm=False, fused_attention_fp32_gqa=False, fused_attention_rng_state=False,
        fused_attention_narrow_values=False, fused_attention_mask=False,
    ),
    "cuda": DeviceRules(
        device="cuda", dropout_mask_bytes=1, norm_stats_fp32=True, fused_attention=True,
        fused_attention_dropout=True, autocast=True, autocast_softmax_fp32=True,
        offload_moves=True, fused_rms_norm=True, fused_attention_fp32_gqa=False, fused_attention_rng_state=True,
        fused_attention_narrow_values=True, fused_attention_mask=None,
    ),
}


def device_rules(device: str) -> DeviceRules:
    kind = device.split(":")[0]
    try:
        return DEVICE_RULES[kind]
    except KeyError:
        raise ConfigError(f"unknown target device {device!r}; valid: {', '.join(DEVICE_RULES)}") from None
