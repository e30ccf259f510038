"""DeepSpeed's ZeRO-1 and ZeRO-2 (the HF Trainer's sharding stages 1 and 2) over two steps of three micro-batches,
on one rank: every collective c10d runs in the second step, by pass.

The agent's decoder (the reference stack's tensors, in the order a forward runs them) in bf16 under DeepSpeed's
``bf16`` (an fp32 master copy in the optimizer), or in fp32 under its ``torch_autocast`` (Headroom's amp-bf16
export), AdamW in two parameter groups as the HF Trainer makes them (the
matrices decayed, the norms and biases not: transformers' ``get_decay_parameter_names``). Per case (stage,
``overlap_comm``, ``reduce_bucket_size``) a dispatch mode records each collective of the second step as
[pass, op, elements, dtype]: a pass is ``backward 0`` .. ``backward 2`` or ``step`` (the boundary's
``engine.step()``); an all-gather's elements are its whole output. ``buffer_bytes``: the bytes of the reduction
buffers DeepSpeed allocates at each backward's start (``setup_buckets``), case by case.
"""

from __future__ import annotations

import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.distributed.data_parallel import MICRO_BATCH, _batch, _decoder

MICRO_BATCHES = 3
SMALL_BUCKET = 20_000
"""A ``reduce_bucket_size`` (elements) that cuts SPEC's 203,840 parameters into several buckets."""
CASES = {
    "zero2": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": None, "precision": "bf16-master"},
    "zero1": {"stage": 1, "overlap_comm": True, "reduce_bucket_size": None, "precision": "bf16-master"},
    "zero1, no overlap": {"stage": 1, "overlap_comm": False, "reduce_bucket_size": None, "precision": "bf16-master"},
    "zero2 autocast": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": None, "precision": "amp-bf16"},
    "zero2 small buckets": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": SMALL_BUCKET,
                            "precision": "bf16-master"},
    "zero1 small buckets, no overlap": {"stage": 1, "overlap_comm": False, "reduce_bucket_size": SMALL_BUCKET,
                                        "precision": "bf16-master"},
}
"""The cases measured; ``reduce_bucket_size`` None keeps DeepSpeed's default (what Headroom's export leaves): the
core prices those call for call, and cuts the small buckets bucket for bucket."""
OPS = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
       "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
       "broadcast_": "broadcast", "reduce_": "reduce", "allgather_": "all_gather"}
"""c10d's ops by the names headroom.core.timing.comm gives them."""


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.phase = ""
        self.calls: list[list] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if self.phase and func.namespace == "c10d" and name in OPS:
            first = args[0]
            tensors = list(first) if isinstance(first, (list, tuple)) else [first]
            self.calls.append([self.phase, OPS[name], sum(t.numel() for t in tensors), str(tensors[0].dtype)])
        return func(*args, **(kwargs or {}))


def _groups(model: torch.nn.Module) -> list[dict]:
    """The HF Trainer's two parameter groups: weight decay on the matrices, none on the norms and biases."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}]


def measure() -> dict:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    rank = dist.get_rank()
    tokens, targets = _batch(rank)
    decoder = _decoder()
    out: dict = {"parameters": [list(p.shape) for p in decoder.parameters()],
                 "linear": [any(p is q for m in decoder.modules() if type(m) is torch.nn.Linear for q in m.parameters(False))
                            for p in decoder.parameters()]}
    for name, case in CASES.items():
        zero = {"stage": case["stage"], "overlap_comm": case["overlap_comm"]}
        if case["reduce_bucket_size"] is not None:
            zero["reduce_bucket_size"] = case["reduce_bucket_size"]
        autocast = case["precision"] == "amp-bf16"  # headroom's export: torch_autocast over fp32 parameters
        precision = {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}} if autocast else {"bf16": {"enabled": True}}
        config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": MICRO_BATCHES,
                  "zero_optimization": zero, **precision, "gradient_clipping": 1.0,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
        model = _decoder(torch.float32 if autocast else torch.bfloat16)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=_groups(model), config=config)
        buffers: list[int] = []
        setup = engine.optimizer.setup_buckets

        def held(setup=setup, optimizer=engine.optimizer, buffers=buffers) -> None:
            """The reduction buffers DeepSpeed allocates at a backward's start, in bytes."""
            setup()
            buffers.append(sum(b.numel() * b.element_size() for bucket in optimizer.ipg_buckets.values()
                               for b in bucket.buffer))

        engine.optimizer.setup_buckets = held
        recorder = _Recorder()
        with recorder:
            for step in range(2):
                for micro in range(MICRO_BATCHES):
                    recorder.phase = ""
                    loss = engine(tokens, targets)
                    recorder.phase = f"backward {micro}" if step else ""
                    engine.backward(loss)
                    recorder.phase = "step" if step else ""
                    engine.step()
                recorder.phase = ""
        out[name] = recorder.calls
        out.setdefault("buffer_bytes", {})[name] = buffers
        engine.destroy()
    return out
