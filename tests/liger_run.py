"""Liger's kernels on the CPU, through Triton's interpreter: what they keep for backward and hold in forward.

    python tests/liger_run.py     # prints one JSON object (tests/test_liger_stack.py reads it)

Run in a process of its own: Triton decides at import whether its kernels are compiled or interpreted
(``TRITON_INTERPRET=1``), and the test session may have imported Triton already.

Two things the interpreter lacks and a compiled kernel has are supplied, neither of which changes what
Liger's Python code allocates or saves: a float argument of a kernel becomes an fp32 scalar (the compiler
specialises it so; the interpreter passes the bare Python float, and ``eps.to(tl.float32)`` fails), and
RMSNorm's ``rsqrt`` from libdevice, which the interpreter cannot run, is ``tl.math.rsqrt``.

- ``models``: transformers' Llama patched by the function the HF Trainer calls under ``use_liger_kernel=True``
  (``transformers.integrations.liger.apply_liger_kernel``), one forward with labels under the saved-tensor
  probe, for fp32 and bf16 with and without the Trainer's checkpointing: the traced ledger (headroom.agent.hf_trace)
  of each.
- ``loss``: Liger's fused linear cross-entropy alone, under the storage counter of tests/test_cross_entropy.py:
  the bytes alive at its forward's peak and its backward's, beyond what its forward kept.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

_interpreted = interpreter._implicit_cvt


def _scalar_as_compiled(arg):
    if isinstance(arg, float):
        return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
    return _interpreted(arg)


interpreter._implicit_cvt = _scalar_as_compiled

import liger_kernel.ops.rms_norm as liger_rms_norm  # noqa: E402

liger_rms_norm.rsqrt = lambda x: tl.math.rsqrt(x)  # looked up when the kernel runs, where the interpreter has it

from liger_kernel.ops.fused_linear_cross_entropy import (
    LigerFusedLinearCrossEntropyFunction,  # noqa: E402
)
from transformers.integrations.liger import apply_liger_kernel  # noqa: E402

from headroom.agent.hf_trace import (  # noqa: E402
    _one_sequence_per_row,
    build_model,
    checkpoint_every_layer,
    ledger_of,
)
from headroom.agent.probe import probe  # noqa: E402
from tests.live_bytes import LiveBytes  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2000, "max_position_embeddings": 512,
         "tie_word_embeddings": False}
"""A small Llama: grouped k/v heads, an untied head, a vocabulary that is no multiple of the hidden size."""
SEQ, MICRO = 32, 2
DTYPES = {"fp32": torch.float32, "bf16-pure": torch.bfloat16}
LOSS_SHAPE = {"tokens": 200, "hidden": 64, "vocab": 512}
"""The loss alone, at bench-llama-tiny's width and vocabulary: 200 tokens in chunks of next_pow2(ceil(200 /
ceil(512 / 64))) = 32 rows, the last one short."""


def model_ledger(precision: str, policy: str) -> dict:
    torch.manual_seed(0)
    model = build_model(LLAMA, DTYPES[precision], "cpu")
    apply_liger_kernel(model, None)  # as transformers.Trainer.__init__ does
    if policy == "full":
        checkpoint_every_layer(model)
    tokens = torch.randint(0, LLAMA["vocab_size"], (MICRO, SEQ))
    with _one_sequence_per_row():
        probed = probe(model, lambda: model(input_ids=tokens, labels=tokens, use_cache=False).loss)
    return ledger_of(probed, "liger-llama", "cpu", model).to_dict()


def loss_moments(precision: str) -> dict:
    torch.manual_seed(0)
    tokens, hidden_size, vocab = LOSS_SHAPE["tokens"], LOSS_SHAPE["hidden"], LOSS_SHAPE["vocab"]
    hidden = torch.randn(tokens, hidden_size, dtype=DTYPES[precision], requires_grad=True)
    weight = torch.randn(vocab, hidden_size, dtype=DTYPES[precision], requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    with LiveBytes(hidden, weight, targets) as live:
        before = live.mark()
        loss = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, targets)[0]
        forward_peak = live.peak
        kept = live.mark()
        loss.backward()
        backward_peak = live.peak
    return {"kept": kept - before, "forward": forward_peak - kept, "backward": backward_peak - kept}


def main() -> None:
    models = {f"{precision} {policy}": model_ledger(precision, policy)
              for precision in DTYPES for policy in ("none", "full")}
    loss = {precision: loss_moments(precision) for precision in DTYPES}
    print(json.dumps({"llama": LLAMA, "seq_len": SEQ, "micro_batch": MICRO, "models": models,
                      "loss_shape": LOSS_SHAPE, "loss": loss}))


if __name__ == "__main__":
    main()
