"""GPU check: test the core's CUDA claims against this GPU in one command, in about 8 minutes.

    python benchmarks/gpu_check.py [--out DIR] [--device cuda:0|cpu] [--parts ledger,suite,...]

Whoever works on a machine with a GPU runs this first and commits what it
wrote (README, "Contributing"). Parts, each in a process of its own with a
time budget, so one that overruns or breaks the CUDA context costs only
itself (agent/check/parts.py). The processes are forked from a server that
imported torch and the agent once (multiprocessing's forkserver, which
never touches CUDA), so a part starts in milliseconds, not seconds:

  environment  torch, CUDA, cuDNN, driver, clocks; the attention kernel SDPA
               picks by itself for a bf16 GQA causal input and an fp32 one
  ledger       the saved-tensor probe against the ledger over block x attention
               x dropout x policy x precision: full-size layers (and one under
               torchtitan's checkpointing), a small-model matrix, and the
               matrix again with each fused SDPA backend forced
  suite        the quick suite, as `headroom agent run --suite quick` runs it
               (matmul, memory-bound ops, attention, the ~1B llama sweep)
  offload      the sweep's offload configurations
  repeat       the suite's largest matmul five more times: is its figure stable?
  fp8          the ~1B llama's step in bf16 and under each torchao float8 recipe
               (needs torchao), against the prediction: peak, saved bytes, step
               time (kept in the report, not in the store)
  compile      the same step with each block compiled as torchtitan compiles it,
               without checkpointing and under full (not stored)
  block        the same step under block-K recompute (Megatron-LM's block
               method: the first K blocks checkpointed, the rest kept whole),
               beside none and full, against the prediction (not stored)
  regret       plans from this box's own measurements at 80 GB and at a budget
               that forces checkpointing; each recommendation, measured, against
               the best measured configuration that fit
  multi-rank   with 2+ GPUs: collectives over all of them and a 2-rank FSDP2 step;
               with one GPU (or a CPU) the 1-rank variant only: a training step
               through torch's launcher, as multi-rank steps run

It writes to --out (default $OUT when set, else ./gpu-check):
<device>-<date>.json.gz, a bundle of every result (`headroom db import` or
`headroom dashboard --bundle` read it); <device>-<date>.md, the report (per
check predicted, measured, error; the targets); <device>-<date>.checks.json,
every part's summary and every ledger check in full; <device>-<date>.log,
the parts' output. It prints a one-screen summary last. On a CPU the same
code runs at toy sizes in about 45 s on 2 cores (tests/test_gpu_check.py).

Exit status: 0 when every part ran (a missed target is a finding, not a
failure of the check), 1 when a part failed or was killed at its limit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from checkout import use_checkout  # noqa: E402

use_checkout()

GRACE_S = 30
"""A part may run this long past its budget (finishing the case it is in) before it is killed."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check",
                        help="directory for the bundle, report and logs (default $OUT, else ./gpu-check)")
    parser.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda:0 if present, else cpu)")
    parser.add_argument("--parts", help="comma-separated parts to run (default all, in order)")
    parser.add_argument("--budget-scale", type=_positive, default=1.0, metavar="X",
                        help="multiply every part's time budget by X (default 1; more on a busy machine, where a "
                             "part that runs out of time leaves its last cases not run)")
    return parser.parse_args(argv)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_BUDGET_SCALE:
        raise argparse.ArgumentTypeError(f"must be a positive number up to {MAX_BUDGET_SCALE}, got {text!r}")
    return value


MAX_BUDGET_SCALE = 100
"""The most a budget may be stretched: the whole check then takes at most a few hours."""


PRELOAD = ["headroom.agent.check.parts", "headroom.agent.suites", "headroom.agent.train_ranks", "headroom.agent.bench_collectives", "headroom.db.bundle"]
"""What the part processes' server imports once (none of it initialises CUDA)."""


def part_process(name: str, device: str, store: str, budget_s: float, result: str, log: str) -> None:
    """One part, in a process of its own: its output to ``log``, its summary to ``result`` as JSON."""
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)  # the part's output and its subprocesses' go to its log
        os.dup2(out.fileno(), 2)
    os.chdir(ROOT)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    import torch

    from headroom.agent.check.parts import PARTS, Context

    context = Context(torch.device(device), store, time.perf_counter() + budget_s)
    summary = PARTS[name][0](context)
    Path(result).write_text(json.dumps(summary, default=str))


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return lines[-1][:300] if lines else ""


def run_part(processes, name: str, budget_s: float, device: str, store: str, work: Path, log) -> dict[str, Any]:
    """Run one part in a process of its own under its time budget; its summary, or why there is none."""
    result_path, part_log = work / f"{name}.json", work / f"{name}.log"
    started = time.perf_counter()
    status, message = "ok", ""
    process = processes.Process(target=part_process, name=f"gpu-check {name}",
                                args=(name, device, store, budget_s, str(result_path), str(part_log)))
    process.start()
    process.join(budget_s + GRACE_S)
    if process.exitcode is None:
        process.kill()
        process.join()
        status, message = "killed", f"still running {budget_s + GRACE_S:.0f} s after it started"
    elif process.exitcode != 0:
        status, message = "failed", f"exit status {process.exitcode}: {last_line(part_log)}"
    seconds = time.perf_counter() - started
    log.write(f"==== {name} ({status}, {seconds:.1f} s) ====\n{part_log.read_text(errors='replace')}\n")
    log.flush()
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if status == "ok" and name == "ledger":
        counts: dict[str, int] = {}
        for c in result.get("checks", []):
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        message = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    elif status == "ok" and "statuses" in result:
        message = ", ".join(f"{n} {s}" for s, n in result["statuses"].items())
    print(f"[{name}] {status} in {seconds:.1f} s {message}", flush=True)
    return {"status": status, "seconds": seconds, "message": message, "result": result}


def slug(device_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown-device"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from headroom.agent.check.parts import PARTS
    from headroom.agent.check.report import Rows, markdown, summary
    from headroom.db.bundle import export_file
    from headroom.db.store import open_store

    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    gpu = torch.device(device).type == "cuda"
    wanted = [p.strip() for p in args.parts.split(",")] if args.parts else list(PARTS)
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        print(f"gpu_check: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="headroom-gpu-check-") as tmp:
        work = Path(tmp)
        store = f"sqlite:///{work / 'results.db'}"
        open_store(store, mode="write").close()
        parts = {}
        # Written after every part, so a check stopped from outside still leaves its findings.
        progress = out / "gpu-check.partial.json"
        processes = multiprocessing.get_context("forkserver")
        processes.set_forkserver_preload(PRELOAD)
        with (out / "gpu-check.log").open("w") as log:
            for name in wanted:
                _, gpu_s, cpu_s = PARTS[name]
                budget_s = (gpu_s if gpu else cpu_s) * args.budget_scale
                parts[name] = run_part(processes, name, budget_s, device, store, work, log)
                progress.write_text(json.dumps(parts, indent=1, default=str))
        fingerprint = parts.get("environment", {}).get("result", {}).get("fingerprint", {})
        stem = f"{slug(fingerprint.get('device_name', ''))}-{date.today().isoformat()}"
        rows = Rows.load(store)
        with open_store(store) as opened:
            export_file(opened, out / f"{stem}.json.gz")
    (out / "gpu-check.log").replace(out / f"{stem}.log")
    progress.replace(out / f"{stem}.checks.json")
    title = f"GPU check: {fingerprint.get('device_name', device)}, {date.today().isoformat()}"
    (out / f"{stem}.md").write_text(markdown(parts, rows, gpu, title))
    print(summary(parts, rows, gpu))
    print(f"wrote {out / stem}.json.gz, .md, .checks.json, .log")
    return 0 if all(p["status"] == "ok" for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
