"""The agent's decoder compiled as torchtitan compiles it, probed on the CPU: what each compiled block keeps.

    python tests/compile_run.py     # prints one JSON object (tests/test_compile.py reads it)

Run in a process of its own: torch.compile leaves dynamo's caches and inductor's compile threads behind in the
process that compiled, which a test session's other tests should not share.

For each case (model, stack, policy, micro-batch, sequence): the ledger's device activation bytes and its tensors
as (dtype, bytes), and the probe's, by autograd's saved-tensor hooks alone (headroom.agent.probe, ``track=False``:
under a dispatch mode dynamo would run the blocks eagerly). The decoder is compiled in one training step first, as
a run compiles it (compiled under the probe's own hooks, a checkpoint keeps no generator state).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from headroom.agent.bench_train import forward_loss
from headroom.agent.ledger_check import DTYPE_NAMES, build
from headroom.agent.probe import probe
from headroom.core.memory.ledger import activation_ledger
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy

CASES = (
    ("bench-llama-tiny", "reference", "none", 2, 64),
    ("bench-llama-tiny", "reference", "full", 2, 64),
    ("bench-llama-tiny", "torchtitan", "none", 2, 64),
    ("bench-llama-tiny", "torchtitan", "full", 2, 64),
    ("bench-llama-small", "torchtitan", "none", 3, 96),
)


def case(model: str, stack: str, policy: str, micro: int, seq: int) -> dict:
    spec = get_preset(model)
    config = TrainConfig(seq_len=seq, micro_batch=micro, precision="bf16-pure", recompute=parse_policy(policy),
                         stack=stack, compile=True)
    decoder, tokens, targets = build(spec, config)
    compiled = all(type(block).__name__ == "OptimizedModule" for block in decoder.blocks)
    forward_loss(decoder, tokens, targets, config.precision).backward()  # compiled as in training
    with torch.random.fork_rng():
        measured = probe(decoder, lambda: forward_loss(decoder, tokens, targets, config.precision), track=False)
    ledger = activation_ledger(spec, config, "cpu")
    predicted = Counter(f"{t.dtype} {t.bytes}" for t in ledger.tensors)
    probed = Counter(f"{DTYPE_NAMES.get(t.dtype, t.dtype)} {t.nbytes}" for t in measured.tensors
                     if t.kind != "parameter")
    return {"compiled": compiled, "ledger_bytes": ledger.device_activation_bytes,
            "probed_bytes": measured.device_activation_bytes, "ledger": predicted, "probed": probed}


def main() -> None:
    print(json.dumps({" ".join(map(str, c)): case(*c) for c in CASES}))


if __name__ == "__main__":
    main()
