"""transformers' own tensor parallelism, rank by rank: what each rank keeps for backward and the parameters it holds.

Each case is a small causal LM of transformers' with random weights: rank 0 saves it, and every rank loads it
with ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=world))``, as a user of the HF Trainer
loads a model to train under tensor parallelism. One forward of the loss is probed (agent/probe.py: a DTensor
counts by its local shard), SDPA choosing its own kernel as on any CPU, and the loss is held against
the same checkpoint loaded whole. tests/test_hf_tensor_parallel.py holds each rank's tensors and parameters
against the analytic ledger of ``--stack hf --tp world``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from headroom.agent.hf_trace import (
    DTYPES,
    build_model,
    checkpoint_every_layer,
    ledger_of,
)
from headroom.agent.parallel import local_tensor
from headroom.agent.probe import probe
from headroom.agent.rank import settled
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.precision import get_precision
from headroom.core.specs.recompute import parse_policy
from tests.distributed.collectives import step_collectives

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64, "pad_token_id": None,
         "bos_token_id": None, "eos_token_id": None, "tie_word_embeddings": False}
"""Four query heads over two key/value heads: each of two ranks holds two query heads and one key/value head."""


@dataclass(frozen=True, slots=True)
class HfTensorParallelCase:
    name: str
    config: dict
    """A ``config.json``, model_type included."""
    precision: str
    recompute: str = "none"
    seq_len: int = 16
    micro_batch: int = 2

    def train(self, tp: int) -> TrainConfig:
        """The configuration the analytic ledger is asked for: the hf stack on ``tp`` ranks (no sequence
        parallelism: transformers has none)."""
        return TrainConfig(seq_len=self.seq_len, micro_batch=self.micro_batch, precision=self.precision,
                           recompute=parse_policy(self.recompute), stack="hf", layout=Layout(tp=tp))


CASES = (
    HfTensorParallelCase("llama-bf16", {"model_type": "llama", **SMALL}, "bf16-pure"),
    HfTensorParallelCase("llama-tied-fp32-full", {"model_type": "llama", **SMALL, "tie_word_embeddings": True},
                         "fp32", "full"),
    HfTensorParallelCase("qwen3-bf16", {"model_type": "qwen3", **SMALL, "head_dim": 16}, "bf16-pure"),
    HfTensorParallelCase("gemma3-window-bf16", {"model_type": "gemma3_text", **SMALL, "head_dim": 16,
                                                "sliding_window": 8}, "bf16-pure"),
)
"""Llama's plan in 16 bits and, tied and checkpointed, in fp32; Qwen3's q and k norms (replicated, their
gradients all-reduced); Gemma 3's sliding-window layers, whose SDPA takes an explicit mask (8 of 16 tokens)."""


def measure(case: HfTensorParallelCase, folder: Path) -> dict:
    """One case on this rank: its kept tensors (a TracedLedger's dict), its parameters, the loss sharded and
    whole, and the collectives of one forward and one backward."""
    import transformers
    from transformers.distributed.configuration_utils import DistributedConfig

    world = dist.get_world_size()
    dtype = DTYPES[get_precision(case.precision).compute_dtype]
    checkpoint = folder / case.name
    if dist.get_rank() == 0:
        torch.manual_seed(0)
        build_model(case.config, dtype, device="cpu").save_pretrained(checkpoint)
    dist.barrier()

    def load(**kwargs) -> torch.nn.Module:
        return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation="sdpa",
                                                                 **kwargs).train()

    model = load(distributed_config=DistributedConfig(tp_size=world))
    if case.recompute == "full":
        checkpoint_every_layer(model)
    tokens = torch.randint(0, case.config["vocab_size"], (case.micro_batch, case.seq_len),
                           generator=torch.Generator().manual_seed(1))  # the same on every rank

    def forward() -> torch.Tensor:
        return model(input_ids=tokens, labels=tokens, use_cache=False).loss

    # settled: gloo lets go of a collective's buffers after it signals the collective done (agent/rank.py)
    traced = ledger_of(probe(model, lambda: settled(forward())), case.name, "cpu", model)
    loss, collectives = step_collectives(forward)
    with torch.no_grad():
        whole = load()(input_ids=tokens, labels=tokens, use_cache=False).loss
    return {
        "ledger": traced.to_dict() | {"n_layers": traced.n_layers},
        "parameters": sum(local_tensor(p).numel() for p in model.parameters()),
        "loss": loss,
        "loss_unsharded": whole.item(),
        "grads_finite": all(torch.isfinite(local_tensor(p.grad)).all().item() for p in model.parameters()),
        "collectives": collectives,
    }

