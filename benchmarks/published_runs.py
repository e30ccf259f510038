"""Published training runs the time model is validated on, each pinned to its published configuration.

    python benchmarks/validation.py   # prints every row's prediction and error

Only the sources the step-time issue names, and nothing here is fitted to them:

- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
  (arXiv 2104.04473), Table 1: GPT models of 1.7B-1T parameters on up to 3,072 A100 80GB GPUs (Selene: DGX
  A100, 8 GPUs a node on NVLink, 8 x 200 Gb/s HDR InfiniBand a node), sequence 2048, vocabulary 51,200. The
  micro-batch, data-parallel implementation, checkpointing (``--recompute-method uniform``: every layer) and
  interleaving of each row are those of the paper's own scripts (NVIDIA/Megatron-LM,
  examples/sc21/run_table_1.sh). Its figure is TFLOP/s per GPU counting 96 B s l h^2 (1 + s / 6h + V / 16lh)
  FLOPs a step (its Eq. 3: GEMMs, recompute included): the predicted figure is that count over the predicted
  step time.
- torchtitan, docs/performance.md, Table 1 (Llama 3.1 8B on 8 H100) and the 405B run (128 H100): tokens/s per
  GPU. Grand Teton hosts: H100 SXM at a 500 W power limit with 96 GB HBM2e.
- mosaicml/llm-foundry, scripts/train/benchmarking/README.md, "H100 80GB BF16": MPT models (scripts/train/yamls:
  GPT blocks without biases, ALiBi in place of positions, vocabulary 50,368, FlashAttention) under Composer's
  FSDP (FULL_SHARD, amp_bf16: fp32 parameters, bf16 compute) with its micro-batch, accumulation and activation
  checkpointing (every block, or none); tokens/s per GPU. The rows at 2,048 tokens on one node of 8, and the
  two 70B rows on 32 and 64 GPUs. Planned on the reference stack (plain PyTorch FSDP with autocast, as
  Composer runs it) with a learned position table standing in for ALiBi's none (under 0.3% of the parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import TrainConfig
from core.layout import Layout
from core.model import ModelSpec
from core.presets import get_preset
from core.recompute import parse_policy

NARAYANAN = "Narayanan et al. 2021 (arXiv 2104.04473), Table 1"
TORCHTITAN = "torchtitan docs/performance.md"


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRun:
    name: str
    source: str
    hardware: str
    """Datasheet key (core.hardware)."""
    spec: ModelSpec
    config: TrainConfig
    global_batch: int
    """Sequences per step."""
    published: float
    unit: str
    """``tflop_per_s_per_gpu`` (Megatron's Eq. 3 count) or ``tokens_per_s_per_gpu``."""

    @property
    def gpus(self) -> int:
        return self.config.layout.world


def _gpt(params: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=f"gpt-{params}", block="gpt", n_layers=layers, hidden=hidden, n_heads=heads,
                     n_kv_heads=heads, ffn_hidden=4 * hidden, vocab_size=51200, max_seq_len=2048,
                     tied_embeddings=True, bias="all")


def megatron_eq3_flops(spec: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Narayanan et al. 2021, Eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16lh), a step's GEMM FLOPs with full
    recompute (four passes of each block, the head's three)."""
    b, s, l, h, v = global_batch, seq_len, spec.n_layers, spec.hidden, spec.vocab_size
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


# (params, heads, hidden, layers, tp, pp, gpus, global batch, micro-batch, virtual stages, TFLOP/s per GPU)
_TABLE_1 = (
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, 163),
    ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, 163),
)
"""Table 1 and, for micro-batch and virtual stages (layers / pp / --num-layers-per-virtual-pipeline-stage),
examples/sc21/run_table_1.sh."""


def _narayanan_runs() -> list[PublishedRun]:
    runs = []
    for params, heads, hidden, layers, tp, pp, gpus, batch, micro, virtual, tflops in _TABLE_1:
        dp = gpus // (tp * pp)
        layout = Layout(tp=tp, pp=pp, dp=dp, schedule="interleaved" if virtual > 1 else "1f1b",
                        virtual_stages=virtual)
        config = TrainConfig(seq_len=2048, micro_batch=micro, precision="bf16-master", optimizer="adam",
                             attention="standard", recompute=parse_policy("full"), dropout=0.1, layout=layout,
                             stack="megatron")
        runs.append(PublishedRun(name=f"GPT {params}", source=NARAYANAN, hardware="a100-sxm-80gb",
                                 spec=_gpt(params, layers, hidden, heads), config=config, global_batch=batch,
                                 published=tflops, unit="tflop_per_s_per_gpu"))
    return runs


LLAMA31_405B = ModelSpec(name="llama3.1-405b", block="llama", n_layers=126, hidden=16384, n_heads=128, n_kv_heads=8,
                         ffn_hidden=53248, vocab_size=128256, max_seq_len=131072, tied_embeddings=False)


def _torchtitan_runs() -> list[PublishedRun]:
    return [
        # Table 1: Llama 3.1 8B, FSDP over 8 GPUs, local batch 2, selective (op) AC, eager: 5,762 tokens/s per GPU.
        PublishedRun(name="Llama 3.1 8B, FSDP 8", source=f"{TORCHTITAN}, Table 1", hardware="h100-sxm",
                     spec=get_preset("llama3-8b"),
                     config=TrainConfig(seq_len=8192, micro_batch=2, recompute=parse_policy("op-selective"),
                                        layout=Layout(dp=8, zero=3), stack="torchtitan"),
                     global_batch=16, published=5762, unit="tokens_per_s_per_gpu"),
        # Llama 3.1 405B on 128 H100: TP 8 x FSDP 16, local batch 2, full AC, no Float8: 109 tokens/s per GPU.
        PublishedRun(name="Llama 3.1 405B, TP 8 x FSDP 16", source=f"{TORCHTITAN}, 405B", hardware="h100-sxm",
                     spec=LLAMA31_405B,
                     config=TrainConfig(seq_len=8192, micro_batch=2, recompute=parse_policy("full"),
                                        layout=Layout(tp=8, sp=True, dp=16, zero=3), stack="torchtitan"),
                     global_batch=32, published=109, unit="tokens_per_s_per_gpu"),
    ]


LLM_FOUNDRY = "llm-foundry benchmarking README, H100 80GB BF16"

# (model, layers, d_model, heads, seq, gpus, micro-batch, accumulation, global batch, checkpointing, T/s/GPU)
_MPT_H100 = (
    ("760m", 24, 1536, 12, 2048, 8, 24, 2, 384, False, 63147),
    ("1b", 24, 2048, 16, 2048, 8, 14, 1, 112, False, 45455),
    ("3b", 32, 2560, 20, 2048, 16, 10, 3, 480, False, 24142),
    ("7b", 32, 4096, 32, 2048, 8, 6, 1, 48, False, 10643),
    ("13b", 40, 5120, 40, 2048, 8, 2, 1, 16, False, 4792),
    ("30b", 48, 7168, 56, 2048, 8, 3, 21, 504, True, 2002),
    ("70b", 80, 8192, 64, 2048, 32, 2, 16, 1024, True, 882),
    ("70b", 80, 8192, 64, 2048, 64, 8, 4, 2048, True, 1039),
)


def _llm_foundry_runs() -> list[PublishedRun]:
    runs = []
    for name, layers, hidden, heads, seq, gpus, micro, accumulation, batch, checkpointing, published in _MPT_H100:
        assert micro * accumulation * gpus == batch, name
        spec = ModelSpec(name=f"mpt-{name}", block="gpt", n_layers=layers, hidden=hidden, n_heads=heads,
                         n_kv_heads=heads, ffn_hidden=4 * hidden, vocab_size=50368, max_seq_len=seq,
                         tied_embeddings=True, bias="none")
        config = TrainConfig(seq_len=seq, micro_batch=micro, precision="amp-bf16", optimizer="adamw",
                             recompute=parse_policy("full" if checkpointing else "none"),
                             layout=Layout(dp=gpus, zero=3))
        runs.append(PublishedRun(name=f"MPT {name}, FSDP {gpus}", source=LLM_FOUNDRY, hardware="h100-sxm",
                                 spec=spec, config=config, global_batch=batch, published=published,
                                 unit="tokens_per_s_per_gpu"))
    return runs


RUNS: tuple[PublishedRun, ...] = (*_narayanan_runs(), *_llm_foundry_runs(), *_torchtitan_runs())
