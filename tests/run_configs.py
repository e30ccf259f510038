"""Run configurations the tests carry between records (headroom.core.specs.run_config): one GPU at its
defaults; a gpt block's configuration with every field away from its default (dropout, so a gpt model); a
layout over every parallel axis but experts."""

from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.run_config import RunConfig

RUNS = [
    RunConfig(train=TrainConfig(seq_len=2048)),
    RunConfig(train=TrainConfig(seq_len=1024, micro_batch=2, precision="bf16-pure", optimizer="sgd", dropout=0.1,
                                attention="standard", recompute=parse_policy("every-2"), stack="megatron"),
              accumulation_steps=8),
    RunConfig(train=TrainConfig(seq_len=8192, recompute=parse_policy("selective"), stack="megatron",
                                layout=Layout(tp=8, sp=True, pp=4, schedule="interleaved", virtual_stages=2, cp=2,
                                              dp=16, zero=1)),
              accumulation_steps=4),
]
