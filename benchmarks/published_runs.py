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
- torchtitan, docs/performance.md, Table 1 (Llama 3.1 8B on 8 H100), Table 3 (the same on 128) and the 405B run
  (128 H100), each without torch.compile or Float8 (the rows that have them are not expressible yet): tokens/s per
  GPU. Grand Teton hosts: H100 SXM at a 500 W power limit with 96 GB HBM2e (``h100-hbm2e``), on Meta's 400 Gb/s
  RDMA fabric. Their attention ran torch's FlashAttention-2 (`TORCH_SDPA_2024`), priced at its H100 rate.
- mosaicml/llm-foundry, scripts/train/benchmarking/README.md (commit 495218376), every row of its four BF16 tables
  (benchmarks/data/llm_foundry_bf16.csv): MPT models of 125M-70B on 8-512 H100s and A100s (80 and 40 GB) under
  Composer's FSDP (FULL_SHARD; or SHARD_GRAD_OP, zero 3 kept gathered from forward to backward), sequences of 512-65,536 tokens, with the published
  micro-batch, accumulation and activation checkpointing (every block, or none); tokens/s per GPU. The models are
  those the tables count, parameter for parameter: GPT blocks with biases and LayerNorm, a learned position table of
  the run's length, tied embeddings, vocabulary 50,368 (scripts/train/yamls/pretrain/mpt-*.yaml). Precision as
  published: amp_bf16 with FSDP's DEFAULT mixed precision (fp32 parameters and gradient reduction, bf16 compute) is
  amp-bf16, bf16 with PURE is bf16-pure. Planned on the reference stack (plain PyTorch FSDP, as Composer runs it),
  on the A100 tables' "1600 Gbps node-node interconnect (RoCE)" (200 Gb/s a GPU) and NDR for the H100 tables
  (they name none). The benchmark scripts run MPT's Triton FlashAttention (``attn_impl: triton``), a
  FlashAttention-1-class kernel: its attention is priced at `fa1_class_efficiency` of the device's peak, half of
  FlashAttention-2's rate there.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy

NARAYANAN = "Narayanan et al. 2021 (arXiv 2104.04473), Table 1"
TORCHTITAN = "torchtitan docs/performance.md"


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRun:
    name: str
    source: str
    hardware: str
    """Datasheet key (headroom.core.specs.hardware)."""
    spec: ModelSpec
    config: TrainConfig
    global_batch: int
    """Sequences per step."""
    published: float
    unit: str
    """``tflop_per_s_per_gpu`` (Megatron's Eq. 3 count), ``tokens_per_s_per_gpu`` or ``mfu`` (a fraction of the
    dense bf16 peak, `megatron_model_flops`)."""
    inter: str
    """The network between nodes as published (headroom.core.specs.interconnect key)."""
    attention_efficiency: float | None = None
    """The run's attention kernel's executed FLOP/s over the dense bf16 peak, where it ran another kernel than the
    device's curves assume (headroom.core.timing.device_curves); None: the curves' own."""
    attention_kernel: str = ""
    """That kernel, as the validation table names it ("FA1-class", "FlashAttention-2"); empty with the curves'."""

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
                                 published=tflops, unit="tflop_per_s_per_gpu", inter="ib-hdr"))
    return runs


LLAMA31_405B = get_preset("llama3.1-405b")
GRAND_TETON = "h100-hbm2e"
"""The H100 torchtitan's performance runs were on (headroom.core.specs.hardware)."""


TORCH_SDPA_2024 = "FlashAttention-2"
"""The attention kernel of torchtitan's H100 runs: its benchmark (benchmarks/llama3_h100_202412_torchtitan.md in
pytorch/torchtitan) ran torch at commit 1963fc8 of 2024-12-23 and torchtitan at 9dec370, whose Llama calls
``F.scaled_dot_product_attention`` with torch's default backend order. That order had made cuDNN's attention opt-in,
last in line, since pytorch/pytorch#138522 (2024-10-22, in 2.5.1), so an H100 ran the flash backend,
FlashAttention-2; torchtitan asked for cuDNN's first only in March 2025 (pytorch/torchtitan#1000), and torch made it
the default on Hopper later still (pytorch/pytorch#162073). Priced at FlashAttention-2's rate on the H100
(`FLASH_ATTENTION_2`), not the device curves' cuDNN kernel."""


def _torchtitan_runs() -> list[PublishedRun]:
    attention = {"attention_efficiency": FLASH_ATTENTION_2["h100"][0], "attention_kernel": TORCH_SDPA_2024}
    return [
        # Table 1: Llama 3.1 8B, FSDP over 8 GPUs, local batch 2, selective (op) AC, eager: 5,762 tokens/s per GPU.
        PublishedRun(name="Llama 3.1 8B, FSDP 8", source=f"{TORCHTITAN}, Table 1", hardware=GRAND_TETON,
                     spec=get_preset("llama3-8b"),
                     config=TrainConfig(seq_len=8192, micro_batch=2, recompute=parse_policy("op-selective"),
                                        layout=Layout(dp=8, zero=3), stack="torchtitan"),
                     global_batch=16, published=5762, unit="tokens_per_s_per_gpu", inter="roce-400g", **attention),
        # Table 3: the same, FSDP over 128 GPUs (16 hosts), local batch 2, global 256, eager: 5,605 tokens/s per GPU.
        PublishedRun(name="Llama 3.1 8B, FSDP 128", source=f"{TORCHTITAN}, Table 3", hardware=GRAND_TETON,
                     spec=get_preset("llama3-8b"),
                     config=TrainConfig(seq_len=8192, micro_batch=2, recompute=parse_policy("op-selective"),
                                        layout=Layout(dp=128, zero=3), stack="torchtitan"),
                     global_batch=256, published=5605, unit="tokens_per_s_per_gpu", inter="roce-400g", **attention),
        # Llama 3.1 405B on 128 H100: TP 8 x FSDP 16, local batch 2, full AC, no Float8: 109 tokens/s per GPU.
        PublishedRun(name="Llama 3.1 405B, TP 8 x FSDP 16", source=f"{TORCHTITAN}, 405B", hardware=GRAND_TETON,
                     spec=LLAMA31_405B,
                     config=TrainConfig(seq_len=8192, micro_batch=2, recompute=parse_policy("full"),
                                        layout=Layout(tp=8, sp=True, dp=16, zero=3), stack="torchtitan"),
                     global_batch=32, published=109, unit="tokens_per_s_per_gpu", inter="roce-400g", **attention),
    ]


MEGATRON_BRIDGE = "Megatron-Bridge docs/performance-summary.md"


def _megatron_bridge_runs() -> list[PublishedRun]:
    """The dense FP8 rows of Megatron-Bridge's DGX-H100 table (25.11 NeMo container) that Headroom can express.

    Llama 3 70B on 64 H100s, FP8-CS (``bf16_with_fp8_current_scaling_mixed``: ``--fp8-format hybrid
    --fp8-recipe tensorwise --fp8-param-gather``), global batch 128, micro-batch 1, sequence 8192,
    TP 4 x PP 8 (virtual 5) x DP 2:
    1,602 tokens/s per GPU. Its recipe (scripts/performance/configs/llama/llama3_workload_base_configs.py,
    ``LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS_V1``; llama3_llm_pretrain.py; recipes/llama/llama3.py): sequence
    parallel, userbuffers tensor-parallel overlap, the distributed optimizer with gradient reduction and parameter
    gathering overlapped, no recompute, gradients reduced in bf16 (``grad_reduce_in_fp32 = False``); DGX H100 nodes
    on 8 x 400 Gb/s InfiniBand; its first and last blocks in bf16 (``first_last_layers_bf16``, the precision
    recipe's: TrainConfig.first_last_bf16).

    Llama 3 8B on 8 H100s, FP8-CS, global batch 128, micro-batch 1, sequence 8192, DP 8: 14,451 tokens/s per GPU.
    Its recipe (``LLAMA3_8B_PRETRAIN_CONFIG_H100_FP8_CS_V1``, commit 280806ccf of 2025-12-09, the 25.11 container's):
    ``recompute_num_layers=5``, which the scripts' overrides (utils/overrides.py) turn into
    ``--recompute-granularity full --recompute-method block --recompute-num-layers 5`` (block-5); the distributed
    optimizer with both overlaps, as the B200 8B row. The table's FSDP column reads 1 for this row (8 in the later
    archive's copy), but the recipe sets no ``use_megatron_fsdp``: planned as the recipe runs it.

    Llama 3.1 405B on 1,024 H100s, FP8-CS, global batch 512, micro-batch 1, sequence 8192, TP 8 x PP 8 (virtual 8)
    x CP 2 x DP 8: 292 tokens/s per GPU. Its recipe (llama31_workload_base_configs.py,
    ``LLAMA31_405B_PRETRAIN_CONFIG_H100_FP8_CS_V1``; llama31_llm_pretrain.py; recipes/llama/llama3.py,
    ``llama31_405b_pretrain_config``): the same common settings as the 70B's, and
    ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``: 126 blocks + 2 over 64
    chunks, 1, 2 x 62, 1 (headroom.core.specs.stages).

    The later containers' tables (docs/performance-summary-archive.md) list the same two H100 layouts at larger
    global batches, on the same recipes (``LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS_V2``, batch 256;
    ``LLAMA31_405B_PRETRAIN_CONFIG_H100_FP8_CS_V2``, batch 1536): rows of their own, each from the first container
    that lists it (26.02, three months after 25.11: 1,621 and 311 tokens/s per GPU), the closest to the other rows'
    software. Later containers measured the same configurations faster (the 70B 1,633-1,664 in 26.02.01-26.04.01,
    the 405B 328 and 326 in 26.04.01 and 26.06), their software newer.

    Beside the H100 rows, the same table's DGX-B200 FP8-CS rows of dense models, on the same recipes
    (``LLAMA3_8B_PRETRAIN_CONFIG_B200_FP8_CS_V1``: 8 GPUs, micro-batch 2, global batch 128, 30,624 tokens/s per GPU;
    ``LLAMA31_405B_PRETRAIN_CONFIG_B200_FP8_CS_V1``: 128 GPUs, TP 4 x PP 8 (virtual 8) x CP 2, global batch 64, 661).
    The 8B recipe's CUDA graphs are not modelled (its step is predicted device-bound). And the same two layouts'
    FP8-MX rows (``LLAMA3_8B_PRETRAIN_CONFIG_B200_FP8_MX_V1`` and ``LLAMA31_405B_PRETRAIN_CONFIG_B200_FP8_MX_V1``, the
    FP8-CS configurations; 29,521 and 624 tokens/s per GPU) under ``bf16_with_mxfp8_mixed``
    (src/megatron/bridge/training/mixed_precision.py): ``--fp8-format e4m3 --fp8-recipe mxfp8``, fp8 parameters
    gathered through the gradient buffer (``reuse_grad_buf_for_mxfp8_param_ag``), no bf16 end blocks."""
    common = {"tp_overlap": True, "overlap_grad_reduce": True, "overlap_param_gather": True, "sp": True, "zero": 1,
              "schedule": "interleaved"}
    dp_8 = Layout(dp=8, zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    runs = []
    for name, system, hardware, model, layout, micro, batch, policy, fp8, published in (
        ("Llama 3 70B, FP8-CS, TP 4 x PP 8 (v5) x DP 2", "DGX-H100", "h100-sxm", "llama3-70b",
         Layout(tp=4, pp=8, dp=2, virtual_stages=5, **common), 1, 128, "none", "te-current", 1602),
        ("Llama 3.1 405B, FP8-CS, TP 8 x PP 8 (v8) x CP 2 x DP 8", "DGX-H100", "h100-sxm", "llama3.1-405b",
         Layout(tp=8, pp=8, cp=2, dp=8, virtual_stages=8, **common), 1, 512, "none", "te-current", 292),
        ("Llama 3 70B, FP8-CS, TP 4 x PP 8 (v5) x DP 2, batch 256 (26.02)", "DGX-H100", "h100-sxm", "llama3-70b",
         Layout(tp=4, pp=8, dp=2, virtual_stages=5, **common), 1, 256, "none", "te-current", 1621),
        ("Llama 3.1 405B, FP8-CS, TP 8 x PP 8 (v8) x CP 2 x DP 8, batch 1536 (26.02)", "DGX-H100", "h100-sxm",
         "llama3.1-405b", Layout(tp=8, pp=8, cp=2, dp=8, virtual_stages=8, **common), 1, 1536, "none", "te-current",
         311),
        ("Llama 3 8B, FP8-CS, DP 8, block-5 recompute", "DGX-H100", "h100-sxm", "llama3-8b",
         dp_8, 1, 128, "block-5", "te-current", 14451),
        ("Llama 3 8B, FP8-CS, DP 8 (B200)", "DGX-B200", "b200", "llama3-8b",
         dp_8, 2, 128, "none", "te-current", 30624),
        ("Llama 3.1 405B, FP8-CS, TP 4 x PP 8 (v8) x CP 2 x DP 2 (B200)", "DGX-B200", "b200", "llama3.1-405b",
         Layout(tp=4, pp=8, cp=2, dp=2, virtual_stages=8, **common), 1, 64, "none", "te-current", 661),
        ("Llama 3 8B, FP8-MX, DP 8 (B200)", "DGX-B200", "b200", "llama3-8b",
         dp_8, 2, 128, "none", "te-mxfp8", 29521),
        ("Llama 3.1 405B, FP8-MX, TP 4 x PP 8 (v8) x CP 2 x DP 2 (B200)", "DGX-B200", "b200", "llama3.1-405b",
         Layout(tp=4, pp=8, cp=2, dp=2, virtual_stages=8, **common), 1, 64, "none", "te-mxfp8", 624),
    ):
        # bf16_with_fp8_current_scaling_mixed keeps the end blocks in bf16; bf16_with_mxfp8_mixed does not
        config = TrainConfig(seq_len=8192, micro_batch=micro, precision="bf16-master", optimizer="adam",
                             recompute=parse_policy(policy), layout=layout, stack="megatron", fp8=fp8,
                             fp8_param_gather=True, first_last_bf16=fp8 == "te-current")
        runs.append(PublishedRun(name=name, source=f"{MEGATRON_BRIDGE}, {system}", hardware=hardware,
                                 spec=get_preset(model), config=config, global_batch=batch, published=published,
                                 unit="tokens_per_s_per_gpu", inter="ib-ndr"))
    return runs


LLM_FOUNDRY = "llm-foundry benchmarking README"

FLASH_ATTENTION_2 = {
    "a100": (0.50, "50-73% of the A100's peak, the low end (Dao 2023, arXiv 2307.08691, abstract)"),
    "h100": (0.35, ("\"only 35% utilization on the H100\" (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, "
                    "abstract)")),
}
"""FlashAttention-2's executed FLOP/s over the dense bf16 peak, by GPU family, with its source. On Hopper the device
curves take the cuDNN kernel the H200 measured (56%), which uses Hopper's own instructions; FlashAttention-2 does not."""
FA1_OVER_FA2 = 25 / 50
"""MPT's ``attn_impl: triton`` (the benchmark scripts' default) is the Triton FlashAttention of 2022-23, a
FlashAttention-1-class kernel: "FlashAttention ... reaching only 25-40% of the theoretical maximum FLOPs/s",
FlashAttention-2 "50-73%" (Dao 2023, arXiv 2307.08691, abstract; A100). The low ends' ratio; on the H100 the same
ratio is assumed."""


def fa1_class_efficiency(hardware: str) -> float:
    """MPT's Triton FlashAttention on ``hardware`` (a datasheet key of the A100 or H100 families): `FA1_OVER_FA2` of
    FlashAttention-2's rate there (`FLASH_ATTENTION_2`)."""
    return FA1_OVER_FA2 * FLASH_ATTENTION_2[hardware.split("-")[0]][0]
LLM_FOUNDRY_CSV = Path(__file__).resolve().parent / "data" / "llm_foundry_bf16.csv"

_MPT = {  # scripts/train/yamls/pretrain/mpt-*.yaml: (layers, d_model, heads); expansion ratio 4, vocabulary 50,368
    "125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
    "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64),
}
_TABLES = {  # (title, device, network: the A100 tables' "1600 Gbps node-node interconnect (RoCE)"; the H100
    # tables name none, NDR assumed)
    "h100-large": ("H100 80GB BF16, >= 128 GPUs", "h100-sxm", "ib-ndr"),
    "h100": ("H100 80GB BF16", "h100-sxm", "ib-ndr"),
    "a100-80gb": ("A100 80GB", "a100-sxm-80gb", "roce-200g"),
    "a100-40gb": ("A100 40GB", "a100-sxm-40gb", "roce-200g"),
}
_PRECISION = {("amp_bf16", "DEFAULT"): "amp-bf16", ("bf16", "PURE"): "bf16-pure"}
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
"""FSDP1's sharding strategy -> zero 3's ``reshard_after_forward``: SHARD_GRAD_OP gathers before forward and frees
after backward (torch/distributed/fsdp/api.py, ``ShardingStrategy``)."""


def mpt_spec(model: str, seq_len: int) -> ModelSpec:
    """An MPT model as the benchmark built it: GPT blocks with biases and LayerNorm, a learned position table of
    the run's sequence length, tied embeddings (its parameter count is the table's NumParams exactly)."""
    layers, hidden, heads = _MPT[model]
    return ModelSpec(name=f"mpt-{model}", block="gpt", n_layers=layers, hidden=hidden, n_heads=heads,
                     n_kv_heads=heads, ffn_hidden=4 * hidden, vocab_size=50368, max_seq_len=seq_len,
                     tied_embeddings=True, bias="all")


@dataclass(frozen=True, slots=True)
class FoundryRow:
    """One row of llm-foundry's BF16 tables, the columns the validation reads (benchmarks/data)."""
    table: str
    model: str
    seq_len: int
    gpus: int
    micro_batch: int
    accumulation: int
    global_batch: int
    tokens_per_s_per_gpu: float
    precision: str
    sharding: str
    checkpointing: bool
    num_params: int


def foundry_rows(path: Path = LLM_FOUNDRY_CSV) -> list[FoundryRow]:
    with path.open() as f:
        reader = csv.DictReader(line for line in f if not line.startswith("#"))
        return [FoundryRow(table=r["table"], model=r["model"], seq_len=int(r["seq_len"]), gpus=int(r["gpus"]),
                           micro_batch=int(r["micro_batch"]),
                           accumulation=int(r["accumulation"]), global_batch=int(r["global_batch"]),
                           tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"]),
                           precision=_PRECISION[r["precision"], r["mp_mode"]], sharding=r["sharding"],
                           checkpointing=r["activation_checkpointing"] == "True", num_params=int(r["num_params"]))
                for r in reader]


def _llm_foundry_runs() -> list[PublishedRun]:
    runs = []
    for row in foundry_rows():
        table, hardware, inter = _TABLES[row.table]
        assert row.micro_batch * row.accumulation * row.gpus == row.global_batch, row
        reshard = _RESHARD[row.sharding]
        config = TrainConfig(seq_len=row.seq_len, micro_batch=row.micro_batch, precision=row.precision,
                             optimizer="adamw", recompute=parse_policy("full" if row.checkpointing else "none"),
                             layout=Layout(dp=row.gpus, zero=3, reshard_after_forward=None if reshard else False))
        sharding = "FSDP" if reshard else "SHARD_GRAD_OP"
        runs.append(PublishedRun(name=f"MPT {row.model}, s {row.seq_len}, {sharding} {row.gpus}",
                                 source=f"{LLM_FOUNDRY}, {table}", hardware=hardware,
                                 spec=mpt_spec(row.model, row.seq_len), config=config, global_batch=row.global_batch,
                                 published=row.tokens_per_s_per_gpu, unit="tokens_per_s_per_gpu",
                                 inter=inter, attention_efficiency=fa1_class_efficiency(hardware),
                                 attention_kernel="FA1-class"))
    return runs


RUNS: tuple[PublishedRun, ...] = (*_narayanan_runs(), *_llm_foundry_runs(), *_torchtitan_runs(),
                                  *_megatron_bridge_runs())

NARAYANAN_TABLE_2 = "Narayanan et al. 2021 (arXiv 2104.04473), Table 2"

# (params, heads, hidden, layers, scheme, tp, pp, gpus, global batch, micro-batch, TFLOP/s per GPU)
_TABLE_2 = (
    ("174.6B", 96, 12288, 96, "ZeRO-3", 1, 1, 384, 1536, 4, 144),
    ("174.6B", 96, 12288, 96, "ZeRO-3", 1, 1, 768, 1536, 2, 88),
    ("174.6B", 96, 12288, 96, "ZeRO-3", 1, 1, 1536, 1536, 1, 44),
    ("529.6B", 128, 20480, 105, "ZeRO-3", 1, 1, 640, 2560, 4, 138),
    ("529.6B", 128, 20480, 105, "ZeRO-3", 1, 1, 1120, 2240, 2, 98),
    ("529.6B", 128, 20480, 105, "ZeRO-3", 1, 1, 2240, 2240, 1, 48),
    ("174.6B", 96, 12288, 96, "PTD-P", 8, 12, 384, 1536, 1, 153),
    ("174.6B", 96, 12288, 96, "PTD-P", 8, 12, 768, 1536, 1, 149),
    ("174.6B", 96, 12288, 96, "PTD-P", 8, 12, 1536, 1536, 1, 141),
    ("529.6B", 128, 20480, 105, "PTD-P", 8, 35, 560, 2240, 1, 171),
    ("529.6B", 128, 20480, 105, "PTD-P", 8, 35, 1120, 2240, 1, 167),
    ("529.6B", 128, 20480, 105, "PTD-P", 8, 35, 2240, 2240, 1, 159),
)


def _narayanan_table_2_runs() -> list[PublishedRun]:
    """Narayanan et al. 2021, Table 2 (Sec. 5.2): the GPT-3 175B and the 530B model on Selene under DeepSpeed's
    ZeRO-3 without model parallelism and under PTD-P, each at three GPU counts of one global batch. Not a validation
    set the step-time issue names: an independent check, to which nothing is fitted, kept out of `RUNS`.

    ZeRO-3 is planned as FSDP on the reference stack (parameters, gradients and optimizer state sharded over every
    rank, each layer gathered forward and again backward), with every layer recomputed (a 175B at micro-batch 4
    cannot keep its activations) and the paper's mixed precision; PTD-P as Table 1's runs, model-parallel size 96 =
    tp 8 x pp 12 and 280 = tp 8 x pp 35, on the 1F1B schedule (the table gives no interleaving). The 530B's ZeRO-3
    run at 640 GPUs is the table's starred row: 560 GPUs did not fit it, and its batch is 2,560."""
    runs = []
    for params, heads, hidden, layers, scheme, tp, pp, gpus, batch, micro, tflops in _TABLE_2:
        zero3 = scheme == "ZeRO-3"
        layout = Layout(dp=gpus, zero=3) if zero3 else Layout(tp=tp, pp=pp, dp=gpus // (tp * pp))
        config = TrainConfig(seq_len=2048, micro_batch=micro, precision="bf16-master", optimizer="adam",
                             attention="standard", recompute=parse_policy("full"), dropout=0.1, layout=layout,
                             stack="reference" if zero3 else "megatron")
        runs.append(PublishedRun(name=f"GPT {params}, {scheme}, {gpus} GPUs", source=NARAYANAN_TABLE_2,
                                 hardware="a100-sxm-80gb", spec=_gpt(params, layers, hidden, heads), config=config,
                                 global_batch=batch, published=tflops, unit="tflop_per_s_per_gpu", inter="ib-hdr"))
    return runs


TORCHTITAN_A100 = "torchtitan docs/performance.md (April 2024), 64 A100"

# (name, preset, sequence, local batch, checkpointing, tokens/s per GPU)
_TORCHTITAN_A100 = (
    ("Llama 3 8B", "llama3-8b", 8192, 1, "op-selective", 2973),
    ("Llama 3 70B", "llama3-70b", 8192, 1, "full", 331),
    ("Llama 2 13B", "llama2-13b", 4096, 2, "none", 2162),
    ("Llama 2 13B", "llama2-13b", 4096, 2, "op-selective", 1904),
    ("Llama 2 70B", "llama2-70b", 4096, 1, "op-selective", 355),
    ("Llama 2 70B", "llama2-70b", 4096, 2, "full", 353),
)


def _torchtitan_a100_runs() -> list[PublishedRun]:
    """torchtitan's first performance table (docs/performance.md at commit 0413364, 24 April 2024): Llama 3 8B and
    70B and Llama 2 13B and 70B under FSDP2 over 64 A100 80GB GPUs, eager, local batch 1 or 2 (global 64 or 128),
    its tokens/s per GPU ("WPS"; 2,904 at 56.8% MFU by its count). Not a validation set the step-time issue names:
    an independent check, nothing fitted to it, kept out of `RUNS`.

    Planned on the torchtitan stack (today's: its fused q/k/v projection, where the 2024 model ran three; its
    per-op checkpointing's every second matmul counted over those) with FSDP's bf16 parameters and fp32 gradient
    reduction (amp-bf16, torchtitan's defaults then and now). The table names no network: InfiniBand HDR, one
    200 Gb/s NIC a GPU, is assumed. Its two "selective layer" rows (every second block checkpointed, an option
    torchtitan dropped in March 2026) are left out: the stack has no such policy."""
    runs = []
    for name, model, seq_len, micro, policy, tokens in _TORCHTITAN_A100:
        config = TrainConfig(seq_len=seq_len, micro_batch=micro, recompute=parse_policy(policy),
                             layout=Layout(dp=64, zero=3), stack="torchtitan")
        runs.append(PublishedRun(name=f"{name}, FSDP 64, {policy}", source=TORCHTITAN_A100,
                                 hardware="a100-sxm-80gb", spec=get_preset(model), config=config,
                                 global_batch=64 * micro, published=tokens, unit="tokens_per_s_per_gpu",
                                 inter="ib-hdr"))
    return runs


KORTHIKANTI = "Korthikanti et al. 2022 (arXiv 2205.05198), abstract"


def megatron_model_flops(spec: ModelSpec, global_batch: int, seq_len: int) -> float:
    """A step's model FLOPs as Korthikanti et al. 2022 count them for MFU: `megatron_eq3_flops` without the
    recompute, 72 B s l h^2 (1 + s / 6h + V / 12lh) (three passes of each block and of the head)."""
    b, s, l, h, v = global_batch, seq_len, spec.n_layers, spec.hidden, spec.vocab_size
    return 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def _korthikanti_runs() -> list[PublishedRun]:
    """Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198),
    abstract: "when training a 530B parameter GPT-3 style model on 2240 NVIDIA A100 GPUs, we achieve a Model Flops
    Utilization of 54.2%, which is 29% faster than the 42.1% we achieve using recomputation": Megatron-LM a year
    after Narayanan et al.'s Table 2, with sequence parallelism and selective recomputation (the attention core
    rerun), against every layer recomputed. Not a validation set the step-time issue names: an independent check,
    nothing fitted to it, kept out of `RUNS`. The abstract gives the model and the GPUs; the rest is assumed from
    the same model's PTD-P row on 2,240 GPUs in Narayanan et al.'s Table 2 (`_TABLE_2`): tp 8 x pp 35 x dp 8, 1F1B,
    micro-batch 1, global batch 2,240, sequence 2,048, the explicit attention with dropout 0.1. MFU over the A100's
    dense bf16 peak, by `megatron_model_flops`."""
    spec = _gpt("529.6B", 105, 20480, 128)
    runs = []
    for name, policy, sp, mfu in (("selective + SP", "selective", True, 0.542), ("full recompute", "full", False, 0.421)):
        config = TrainConfig(seq_len=2048, micro_batch=1, precision="bf16-master", optimizer="adam",
                             attention="standard", recompute=parse_policy(policy), dropout=0.1,
                             layout=Layout(tp=8, sp=sp, pp=35, dp=8), stack="megatron")
        runs.append(PublishedRun(name=f"GPT 529.6B, {name}, 2240 GPUs", source=KORTHIKANTI, hardware="a100-sxm-80gb",
                                 spec=spec, config=config, global_batch=2240, published=mfu, unit="mfu",
                                 inter="ib-hdr"))
    return runs


INDEPENDENT: tuple[PublishedRun, ...] = (*_narayanan_table_2_runs(), *_torchtitan_a100_runs(), *_korthikanti_runs())
"""Published runs outside the validation sets: checks of the model, never fitted to."""
