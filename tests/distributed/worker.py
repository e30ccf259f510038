"""One rank of the distributed memory measurements; writes ``rank{N}.json`` to ``--out``.

Run under torch's launcher (tests/distributed/launch.py does this), from the repository root:

    python -m torch.distributed.run --nproc-per-node 2 --standalone \\
        --module tests.distributed.worker --out /tmp/dist --suites tp fsdp ddp

Every collective runs under the process group's timeout (``--timeout-s``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

SUITES = ("tp", "fsdp", "fsdp-schedule", "ddp", "ep", "cp", "hf-tp", "deepspeed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for one JSON per rank")
    parser.add_argument("--suites", nargs="+", choices=SUITES, default=list(SUITES),
                        help="what to measure: tensor parallelism, FSDP2, FSDP2's collectives under each resharding "
                             "and gradient-sync setting, DDP, expert parallelism, torch's ring attention, "
                             "transformers' tensor parallelism, DeepSpeed's ZeRO-1 and 2")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="seconds any collective may wait before the process group gives up")
    return parser.parse_args(argv)


def run(suites: list[str], world: int, out: Path) -> dict:
    # Imported here: each pulls in the agent's model and the core.
    from headroom.agent.parallel import UNITS
    from tests.distributed.data_parallel import BUCKETED_SPEC, measure_ddp, measure_fsdp, measure_zero1
    from tests.distributed.tensor_parallel import cases, measure

    mesh = init_device_mesh("cpu", (world,))
    result: dict = {}
    if "tp" in suites:
        started = time.perf_counter()
        result["tensor_parallel"] = {case.name: measure(case, mesh) for case in cases(world)}
        result["seconds"] = {"tp": time.perf_counter() - started}
    if "fsdp" in suites:
        started = time.perf_counter()
        result["fsdp"] = {units: measure_fsdp(mesh, units) for units in UNITS}
        result.setdefault("seconds", {})["fsdp"] = time.perf_counter() - started
    if "fsdp-schedule" in suites:
        from tests.distributed import fsdp_schedule

        started = time.perf_counter()
        result["fsdp_schedule"] = fsdp_schedule.measure(mesh)
        result.setdefault("seconds", {})["fsdp-schedule"] = time.perf_counter() - started
    if "ddp" in suites:
        started = time.perf_counter()
        result["ddp"] = measure_ddp()
        result["ddp_buckets"] = measure_ddp(BUCKETED_SPEC)
        result["zero1"] = measure_zero1()
        result.setdefault("seconds", {})["ddp"] = time.perf_counter() - started
    if "ep" in suites:
        from tests.distributed import expert_parallel

        started = time.perf_counter()
        result["expert_parallel"] = expert_parallel.measure()
        result.setdefault("seconds", {})["ep"] = time.perf_counter() - started
    if "cp" in suites:
        from tests.distributed import context_parallel

        started = time.perf_counter()
        result["context_parallel"] = context_parallel.measure()
        result.setdefault("seconds", {})["cp"] = time.perf_counter() - started
    if "hf-tp" in suites:  # imports transformers: only when asked
        from tests.distributed import hf_tensor_parallel

        started = time.perf_counter()
        result["hf_tensor_parallel"] = {case.name: hf_tensor_parallel.measure(case, out)
                                        for case in hf_tensor_parallel.CASES}
        result.setdefault("seconds", {})["hf-tp"] = time.perf_counter() - started
    if "deepspeed" in suites:  # imports DeepSpeed: only when asked
        from tests.distributed import deepspeed_zero

        started = time.perf_counter()
        result["deepspeed_zero"] = deepspeed_zero.measure()
        result.setdefault("seconds", {})["deepspeed"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    record: dict = {"rank": rank, "world_size": world, "torch": torch.__version__,
                    "local_rank": int(os.environ.get("LOCAL_RANK", rank))}
    try:
        record |= run(args.suites, world, args.out)
        record["error"] = None
    except Exception:  # written down for the launcher, then raised so the launcher sees a failure
        record["error"] = traceback.format_exc()
        raise
    finally:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
