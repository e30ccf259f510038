"""Collective bandwidth over the box's devices: all-reduce, all-gather, reduce-scatter, all-to-all, send/recv.

Run by the agent as one launch of torch's launcher, one process per GPU
(NCCL), or N processes on a CPU (gloo). Definitions follow nccl-tests
(doc/PERFORMANCE.md), so the figures compare with theirs:

- the message size S is the whole buffer: all-reduce's tensor, all-gather's
  gathered output, reduce-scatter's full input, all-to-all's per-rank input,
  send/recv's per-rank buffer (each rank sends to the next and receives from
  the previous, a ring);
- ``algbw = S / t`` and ``busbw = algbw x bus_factor`` (headroom.core.timing.comm.bus_factor:
  all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n,
  send/recv 1), the figure to compare with a link's per-direction bandwidth.

Each sample times a block of back-to-back calls (CUDA events on the rank's
stream; the host clock on the CPU, where gloo's calls return when done) after
a barrier, and the sample kept is the slowest rank's: a collective is done
when its last rank is. The calls per block are sized on a warm-up so one
block lasts about ``BLOCK_S``, and agreed between ranks. Before timing, each
op's output is checked against the arithmetic it must do.

Rank side: ``python -m headroom.agent.bench_collectives`` under torch's launcher;
parent side: `cases`, whose rows arrive through headroom.agent.launch.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from headroom.agent.cases import Case
from headroom.agent.launch import Launch, emit
from headroom.agent.rank import RankInfo, add_rank_flags, join, leave
from headroom.core.safe_text import printable
from headroom.core.timing.collective_ops import OPS, bus_factor
from headroom.db.models import CollectiveResult

KiB, MiB, GiB = 2**10, 2**20, 2**30
GPU_SIZES = tuple(KiB * 4**i for i in range(11))  # 1 KiB .. 1 GiB
CPU_SIZES = tuple(KiB * 4**i for i in range(7))  # 1 KiB .. 4 MiB
DTYPE = {"cuda": ("bf16", torch.bfloat16), "cpu": ("fp32", torch.float32)}
BLOCK_S = {"cuda": 0.005, "cpu": 0.01}
SAMPLES = {"cuda": 10, "cpu": 5}
WARMUP = {"cuda": 5, "cpu": 2}
MAX_CALLS = 1000


def sizes(device_type: str) -> tuple[int, ...]:
    return GPU_SIZES if device_type == "cuda" else CPU_SIZES


def case_key(op: str, message_bytes: int) -> str:
    return f"{op} {message_bytes}"


def case_name(op: str, message_bytes: int, group_size: int) -> str:
    size = f"{message_bytes // MiB} MiB" if message_bytes >= MiB else f"{message_bytes // KiB} KiB"
    return f"{op} x{group_size} {size}"


# ---- rank side ----------------------------------------------------------------------------------


class Buffers:
    """One op's tensors for a message of ``message_bytes`` (rounded down to whole elements per rank),
    filled with rank + 1 so the result's arithmetic can be checked."""

    def __init__(self, op: str, message_bytes: int, info: RankInfo, dtype: torch.dtype) -> None:
        n, rank, device = info.world, info.rank, info.device
        per_rank = max(1, message_bytes // dtype.itemsize // n)
        self.op, self.n, self.rank = op, n, rank
        full = per_rank * n
        value = float(rank + 1)
        if op == "all_reduce":
            self.input = torch.full((full,), value, dtype=dtype, device=device)
            self.output = self.input
        elif op == "all_gather":
            self.input = torch.full((per_rank,), value, dtype=dtype, device=device)
            self.output = torch.empty(full, dtype=dtype, device=device)
        elif op == "reduce_scatter":
            self.input = torch.full((full,), value, dtype=dtype, device=device)
            self.output = torch.empty(per_rank, dtype=dtype, device=device)
        elif op == "all_to_all":
            self.input = torch.full((full,), value, dtype=dtype, device=device)
            self.output = torch.empty(full, dtype=dtype, device=device)
        else:  # send_recv: S per rank
            self.input = torch.full((full,), value, dtype=dtype, device=device)
            self.output = torch.empty(full, dtype=dtype, device=device)
        self.message_bytes = full * dtype.itemsize

    def call(self) -> None:
        if self.op == "all_reduce":
            dist.all_reduce(self.input)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(self.output, self.input)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.output, self.input)
        elif self.op == "all_to_all":
            dist.all_to_all_single(self.output, self.input)
        else:
            ops = [dist.P2POp(dist.isend, self.input, (self.rank + 1) % self.n),
                   dist.P2POp(dist.irecv, self.output, (self.rank - 1) % self.n)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def check(self) -> None:
        """After one call: the output holds what the op must compute (ranks hold rank + 1)."""
        n, total = self.n, self.n * (self.n + 1) / 2
        out = self.output.float().cpu()
        if self.op in ("all_reduce", "reduce_scatter"):
            expected = torch.full_like(out, total)
        elif self.op in ("all_gather", "all_to_all"):
            expected = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(out.numel() // n)
        else:
            expected = torch.full_like(out, float((self.rank - 1) % n + 1))
        if not torch.equal(out, expected):
            raise AssertionError(f"{self.op} computed a wrong result on rank {self.rank}")


def _agree(value: float, info: RankInfo, op=dist.ReduceOp.MAX) -> torch.Tensor:
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=op)
    return t


def time_block(call: Callable[[], None], calls: int, info: RankInfo) -> float:
    """Seconds per call over a block of ``calls`` on this rank, after a barrier."""
    dist.barrier()
    if info.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def measure(op: str, message_bytes: int, info: RankInfo) -> dict:
    """One op at one size: the slowest rank's samples, and the bandwidths of their median."""
    dtype_name, dtype = DTYPE[info.device.type]
    buffers = Buffers(op, message_bytes, info, dtype)
    buffers.call()
    if info.device.type == "cuda":
        torch.cuda.synchronize()
    buffers.check()
    for _ in range(WARMUP[info.device.type] - 1):
        buffers.call()
    probe_s = time_block(buffers.call, 2, info)
    calls = int(min(MAX_CALLS, max(1, round(BLOCK_S[info.device.type] / max(probe_s, 1e-7)))))
    calls = int(_agree(calls, info).item())
    mine = [time_block(buffers.call, calls, info) for _ in range(SAMPLES[info.device.type])]
    samples = _agree(0.0, info).new_tensor(mine)
    dist.all_reduce(samples, op=dist.ReduceOp.MAX)
    samples_s = samples.tolist()
    median = statistics.median(samples_s)
    algbw = buffers.message_bytes / median / 1e9
    return {
        "op": op, "backend": info.backend, "dtype": dtype_name, "group_size": info.world,
        "message_bytes": buffers.message_bytes, "samples_s": samples_s, "median_s": median,
        "min_s": min(samples_s), "max_s": max(samples_s), "algbw_gb_per_s": algbw,
        "busbw_gb_per_s": algbw * bus_factor(op, info.world),
        "details": {"calls_per_sample": calls, "requested_bytes": message_bytes},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One rank of the collective benchmarks (run under torchrun).")
    add_rank_flags(parser)
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--sizes", nargs="+", type=int, default=None, help="message bytes (default: by device)")
    args = parser.parse_args(argv)
    info = join(args.device_type, args.timeout_s)
    try:
        for op in args.ops:
            for size in args.sizes or sizes(args.device_type):
                try:
                    row = measure(op, size, info)
                except (RuntimeError, AssertionError, ValueError) as err:
                    row = {"op": op, "backend": info.backend, "dtype": DTYPE[args.device_type][0],
                           "group_size": info.world, "message_bytes": size, "status": "error",
                           "message": f"{type(err).__name__}: {printable(str(err).strip())[:300]}"}
                    if not isinstance(err, AssertionError):  # a collective failed: the group may be broken
                        if info.rank == 0:
                            emit(case_key(op, size), 0, row)
                        raise
                if info.rank == 0:
                    emit(case_key(op, size), 0, row)
    except Exception:
        traceback.print_exc(file=sys.stdout)
        return 1
    finally:
        leave()
    return 0


# ---- parent side --------------------------------------------------------------------------------


def cases(device_type: str, group_size: int, *, timeout_s: float | None = None,
          ops: tuple[str, ...] = OPS, message_sizes: tuple[int, ...] | None = None) -> list[Case]:
    """Every (op, size) over ``group_size`` local ranks, measured by one launch started with the first."""
    message_sizes = message_sizes or sizes(device_type)
    per_case = 0.5 if device_type == "cpu" else 0.3
    if timeout_s is None:
        timeout_s = 120 + 10 * per_case * len(ops) * len(message_sizes)
    args = ["--device-type", device_type, "--ops", *ops, "--sizes", *map(str, message_sizes)]
    launch = Launch("headroom.agent.bench_collectives", group_size, args, timeout_s=timeout_s,
                    env={"OMP_NUM_THREADS": "1"} if device_type == "cpu" else None)
    dtype = DTYPE[device_type][0]
    backend = "nccl" if device_type == "cuda" else "gloo"
    last = case_key(ops[-1], message_sizes[-1])

    def measure_case(device: torch.device, key: str) -> CollectiveResult:
        try:
            return CollectiveResult(**launch.result(key))
        finally:
            if key == last:
                launch.close()

    return [
        Case(
            kind="collectives",
            name=case_name(op, size, group_size),
            expected_s=per_case + (3.0 if (op, size) == (ops[0], message_sizes[0]) else 0.0),
            measure=functools.partial(measure_case, key=case_key(op, size)),
            failed=lambda status, message, op=op, size=size: CollectiveResult(
                op=op, backend=backend, dtype=dtype, group_size=group_size, message_bytes=size,
                status=status, message=message),
        )
        for op in ops
        for size in message_sizes
    ]


if __name__ == "__main__":
    raise SystemExit(main())
