"""The GPU check's report: targets, per-check tables (predicted, measured, error), a summary.

Errors are measured / predicted - 1 throughout, as in headroom.core.measured.calibration (positive: more than predicted).

Everything here is read back from the check's result store and the parts'
summaries; nothing is measured. Targets (issue 16, checked only on a GPU):

- peak allocated vs predicted over the training sweep: median |error| <= 3%, worst <= 8%;
- saved activations vs the ledger: within 2%, training steps and ledger checks alike;
- bf16 8192^3 matmul >= 740 TFLOP/s (H200) and >= 0.97 of the best of repeated runs;
- copy bandwidth >= 3.9 TB/s (read + write);
- the quick suite under 3 minutes;
- regret <= 3% at 80 GB and at a budget that forces checkpointing, no recommendation out of memory;
- SDPA handed an explicit mask keeps what the ledger's CPU rule says (headroom.agent.check.masked_sdpa): until it
  does on CUDA, the hf stack refuses transformers' masked sliding-window layers there.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from headroom.db.models import (
    AttentionResult,
    ElementwiseResult,
    MatmulResult,
    Result,
    Run,
    TrainStepResult,
)
from headroom.db.store import open_store

MEMORY_MEDIAN, MEMORY_WORST, LEDGER_TOLERANCE = 0.03, 0.08, 0.02
MATMUL_TFLOP_PER_S, MATMUL_STABILITY, COPY_GB_PER_S = 740.0, 0.97, 3900.0
SUITE_S, REGRET = 180.0, 0.03


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    measured: str
    target: str
    verdict: str
    """``pass``, ``FAIL`` or ``n/a`` (not measurable here)."""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _gb(n: int | float | None) -> str:
    return "-" if n is None else f"{n / 1e9:,.3f}"


def _verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


@dataclass(slots=True)
class Rows:
    """The check's stored results by kind."""

    matmul: list[MatmulResult]
    elementwise: list[ElementwiseResult]
    attention: list[AttentionResult]
    train: list[TrainStepResult]
    suites: dict[int, str]
    """run id -> suite name."""

    @classmethod
    def load(cls, url: str) -> Rows:
        with open_store(url) as store, store.session() as session:
            def rows(model: type[Result]) -> list:
                return list(session.scalars(select(model).order_by(model.id)))

            suites = dict(session.execute(select(Run.id, Run.suite)).all())
            return cls(rows(MatmulResult), rows(ElementwiseResult), rows(AttentionResult), rows(TrainStepResult), suites)


def training_errors(rows: Rows) -> tuple[list[float], list[float]]:
    """(peak allocated errors, saved-activation errors) of the ok training steps: measured / predicted - 1."""
    ok = [r for r in rows.train if r.status == "ok"]
    peak = [r.peak_allocated_bytes / r.predicted_peak_bytes - 1 for r in ok
            if r.peak_allocated_bytes and r.predicted_peak_bytes]
    saved = [r.activation_bytes / r.predicted_activation_bytes - 1 for r in ok
             if r.activation_bytes and r.predicted_activation_bytes]
    return peak, saved


def targets(parts: dict[str, dict[str, Any]], rows: Rows, gpu: bool) -> list[Target]:
    out = []
    peak, saved = training_errors(rows)
    if gpu and peak:
        median, worst = statistics.median(abs(e) for e in peak), max(abs(e) for e in peak)
        out.append(Target("peak allocated vs predicted", f"median {median:.1%}, worst {worst:.1%} over {len(peak)} steps",
                          f"median <= {MEMORY_MEDIAN:.0%}, worst <= {MEMORY_WORST:.0%}",
                          _verdict(median <= MEMORY_MEDIAN and worst <= MEMORY_WORST)))
    else:
        out.append(Target("peak allocated vs predicted", "no allocator statistics" if not gpu else "no steps",
                          f"median <= {MEMORY_MEDIAN:.0%}, worst <= {MEMORY_WORST:.0%}", "n/a"))
    if saved:
        worst = max(abs(e) for e in saved)
        out.append(Target("saved activations vs ledger (training steps)", f"worst {worst:.2%} over {len(saved)} steps",
                          f"<= {LEDGER_TOLERANCE:.0%}", _verdict(worst <= LEDGER_TOLERANCE)))
    checks = parts.get("ledger", {}).get("result", {}).get("checks", [])
    judged = [c for c in checks if c["status"] in ("ok", "mismatch")]
    if judged:
        good = sum(c["status"] == "ok" for c in judged)
        out.append(Target("ledger checks (probe vs ledger)", f"{good}/{len(judged)} within {LEDGER_TOLERANCE:.0%}",
                          "all", _verdict(good == len(judged))))
    masked = parts.get("environment", {}).get("result", {}).get("sdpa_masked", [])
    if masked:
        good = sum(p["status"] == "ok" for p in masked)
        out.append(Target("masked SDPA keeps what the CPU's rule says (sliding windows under transformers)",
                          f"{good}/{len(masked)} probes", "all", _verdict(good == len(masked))))
    out += _matmul_targets(parts, rows, gpu)
    copies = [r.gb_per_s for r in rows.elementwise if r.status == "ok" and r.op == "copy"]
    if gpu and copies:
        out.append(Target("copy bandwidth", f"{max(copies) / 1e3:.2f} TB/s", f">= {COPY_GB_PER_S / 1e3:.1f} TB/s",
                          _verdict(max(copies) >= COPY_GB_PER_S)))
    suite = parts.get("suite", {})
    if suite.get("status") == "ok":
        seconds = suite["result"]["seconds"]
        out.append(Target("quick suite wall time", f"{seconds:.0f} s", f"< {SUITE_S:.0f} s" if gpu else "-",
                          _verdict(seconds < SUITE_S) if gpu else "n/a"))
    for entry in parts.get("regret", {}).get("result", {}).get("plans", []):
        out.append(_regret_target(entry))
    return out


def _matmul_targets(parts: dict[str, dict[str, Any]], rows: Rows, gpu: bool) -> list[Target]:
    info = parts.get("repeat", {}).get("result")
    if not info:
        return []
    dtype, size = info["dtype"], info["size"]
    same = [r for r in rows.matmul if r.status == "ok" and r.dtype == dtype and r.m == r.n == r.k == size]
    suite = [r.tflop_per_s for r in same if rows.suites.get(r.run_id) != "gpu-check"]
    repeats = [r.tflop_per_s for r in same if rows.suites.get(r.run_id) == "gpu-check"]
    if not suite or not repeats:
        return []
    ratio = suite[0] / max(repeats + suite)
    name = f"{dtype} {size}^3 matmul"
    out = [Target(f"{name}: suite vs best of {len(repeats)} repeats", f"{ratio:.3f} ({suite[0]:,.1f} TFLOP/s)",
                  f">= {MATMUL_STABILITY}", _verdict(ratio >= MATMUL_STABILITY))]
    if gpu:
        best = max(repeats + suite)
        out.append(Target(f"{name} throughput", f"{best:,.1f} TFLOP/s", f">= {MATMUL_TFLOP_PER_S:.0f} TFLOP/s (H200)",
                          _verdict(best >= MATMUL_TFLOP_PER_S)))
    return out


def _regret_target(entry: dict[str, Any]) -> Target:
    name = f"regret at {entry['budget']}"
    if entry.get("recommended") is None and "recommended" not in entry:
        return Target(name, entry.get("outcome", "-"), f"<= {REGRET:.0%}", "n/a")
    if entry["outcome"] != "ok":
        return Target(name, f"{entry['outcome']}: {entry.get('recommended')}", f"<= {REGRET:.0%}, never oom", "FAIL")
    measured = (f"{entry['regret']:.1%}: recommended {entry['recommended']} {entry['recommended_tokens_per_s']:,.0f} "
                f"tokens/s, best {entry['best']} {entry['best_tokens_per_s']:,.0f} (fit by {entry['fit_by']})")
    return Target(name, measured, f"<= {REGRET:.0%}", _verdict(entry["regret"] <= REGRET))


# ---- markdown ---------------------------------------------------------------------------------


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in body]


def _clock(row: Result, key: str = "clocks") -> str:
    clocks = (row.details or {}).get(key) or (row.details or {}).get("forward", {}).get(key)
    if not clocks:
        return "-"
    throttle = [t for t in clocks.get("throttle", []) if t != "gpu_idle"]
    return f"{clocks.get('sm_mhz', '?')} MHz" + (f" ({', '.join(throttle)})" if throttle else "")


def _train_table(rows: Rows) -> list[str]:
    body = []
    for r in rows.train:
        label = f"micro {r.micro_batch} x{r.accumulation_steps} {r.recompute}"
        if r.status != "ok":
            body.append([label, r.status, _gb(r.predicted_peak_bytes), _gb(r.peak_allocated_bytes), "", "", "", "", "",
                         "", "", (r.message or "")[:80]])
            continue
        details = r.details or {}
        memory = (r.prediction or {}).get("memory_bytes", {})
        kept_predicted = memory.get("activations", 0) + memory.get("logits", 0) + memory.get("weight_copies", 0)
        kept = details.get("forward_kept_bytes")
        frag = f"{r.peak_reserved_bytes / r.peak_allocated_bytes:.3f}" if r.peak_allocated_bytes else "-"
        body.append([
            label, "ok", _gb(r.predicted_peak_bytes), _gb(r.peak_allocated_bytes),
            _pct(r.peak_allocated_bytes / r.predicted_peak_bytes - 1) if r.peak_allocated_bytes else "-", frag,
            f"{_gb(r.predicted_activation_bytes)} / {_gb(r.activation_bytes)}",
            _pct(r.activation_bytes / r.predicted_activation_bytes - 1)
            if r.activation_bytes and r.predicted_activation_bytes else "-",
            f"{_gb(kept_predicted)} / {_gb(kept)}" if kept is not None else "-",
            f"{r.predicted_step_time_s:.3f} / {r.median_s:.3f}" if r.predicted_step_time_s else f"- / {r.median_s:.3f}",
            f"{r.tokens_per_s:,.0f}", details.get("kernel", "-"),
        ])
    header = ["configuration", "status", "peak GB predicted", "peak GB measured", "error", "reserved/allocated",
              "saved GB ledger / probe", "error", "kept by forward GB ledger / allocator", "step s predicted / measured",
              "tokens/s", "attention kernel"]
    return _table(header, body)


def _variant_table(parts: dict[str, dict[str, Any]], part: str, first: str) -> list[str]:
    """The fp8, compile or block part's steps: each variant's peak, saved bytes and step time against the prediction,
    and its first step's time (a compiled model's includes its compile)."""
    result = parts.get(part, {}).get("result") or {}
    if not result.get("steps"):
        return ["(not run)"]
    body = []
    for step in result["steps"]:
        if step["status"] != "ok":
            body.append([step["label"], step["status"], "", "", "", "", (step.get("message") or "")[:120]])
            continue
        peak, saved = step["peak_allocated_bytes"], step["activation_bytes"]
        predicted_s, first_s = step["predicted_step_time_s"], step.get("first_step_s")
        body.append([
            step["label"], "ok",
            f"{_gb(step['predicted_peak_bytes'])} / {_gb(peak)}" if peak else f"{_gb(step['predicted_peak_bytes'])} / -",
            f"{step['predicted_activation_bytes']:,} / {saved:,}" if saved is not None else "-",
            f"{predicted_s:.3f} / {step['median_s']:.3f}" if predicted_s else f"- / {step['median_s']:.3f}",
            f"{first_s:.2f}" if first_s is not None else "-", ""])
    title = f"{result['model']}, seq-len {result['seq_len']}, micro-batch {result['micro_batch']}, bf16-pure:"
    return [title, ""] + _table([first, "status", "peak GB predicted / measured", "saved bytes ledger / probe",
                                 "step s predicted / measured", "first step s", "note"], body)


def _kernels_table(parts: dict[str, dict[str, Any]]) -> list[str]:
    """The compile part's one block compiled alone: inductor's kernels and their bytes, forward and backward, beside
    the memory-bound ops the time model enumerates for the block run eagerly."""
    kernels = (parts.get("compile", {}).get("result") or {}).get("kernels")
    if not kernels:
        return ["(not run)"]
    if kernels["status"] != "ok":
        return [f"error: {kernels['message']}"]
    if not kernels["graphs"]:
        return ["(inductor logged no graph metrics in this torch)"]
    body = [[str(i), str(g["kernels"]), f"{g['kernel_bytes']:,}", str(g["externs"]), f"{g['extern_bytes']:,}"]
            for i, g in enumerate(kernels["graphs"], 1)]
    title = (f"{kernels['model']}, one block (torchtitan, bf16-pure): eagerly, {kernels['eager_memory_ops']} "
             f"memory-bound ops moving {kernels['eager_memory_bytes']:,} bytes forward, as the time model enumerates "
             "them; inductor's graphs in the order it compiled them, forward first, then backward")
    return [title, ""] + _table(["graph", "generated kernels", "their bytes", "extern kernels", "their bytes"], body)


def _ledger_section(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return ["(not run)"]
    counts: dict[str, int] = {}
    for c in checks:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    lines = [", ".join(f"{n} {s}" for s, n in sorted(counts.items())), ""]
    body = []
    for c in checks:
        if c["status"] not in ("ok", "mismatch"):
            continue
        parts = c["parts"]
        body.append([c["label"], c["status"], c.get("kernel") or "-",
                     *(f"{parts[p]['predicted']:,} / {parts[p]['measured']:,}" for p in parts),
                     _pct(c["error"]) if c["error"] is not None else "-"])
    lines += _table(["configuration", "status", "kernel", "device activations ledger / probe", "host",
                     "weight copies", "worst error"], body)
    mismatches = [c for c in checks if c["status"] == "mismatch"]
    if mismatches:
        lines += ["", "Mismatches, the storages one side has and the other lacks:", ""]
        for c in mismatches[:40]:
            lines.append(f"- {c['label']}: " + "; ".join(c["diff"][:6]))
    reasons: dict[str, list[str]] = {}
    for c in checks:
        if c["status"] not in ("ok", "mismatch"):
            reasons.setdefault(f"{c['status']}: {c.get('message', '')[:300]}", []).append(c["label"])
    if reasons:
        lines += ["", "Not compared:", ""]
        lines += [f"- {reason} ({len(labels)} configurations, e.g. {labels[0]})" for reason, labels in reasons.items()]
    return lines


def markdown(parts: dict[str, dict[str, Any]], rows: Rows, gpu: bool, title: str) -> str:
    env = parts.get("environment", {}).get("result", {})
    fp = env.get("fingerprint", {})
    lines = [f"# {title}", "",
             f"Device: {fp.get('device_name', '?')} ({fp.get('device_type', '?')}), torch {fp.get('torch_version')}, "
             f"CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, driver {fp.get('driver_version')}, "
             f"host {fp.get('hostname')}, CPU {fp.get('cpu_model')}.", "",
             "SDPA's own choice: " + ", ".join(f"{k} -> {v}" for k, v in env.get("sdpa", {}).items()) + ".", "",
             "## Parts", ""]
    lines += _table(["part", "status", "seconds", "note"],
                    [[name, p.get("status"), f"{p.get('seconds', 0):.1f}", (p.get("message") or "")[:120]]
                     for name, p in parts.items()])
    lines += ["", "## Targets", ""]
    lines += _table(["target", "measured", "wanted", "verdict"],
                    [[t.name, t.measured, t.target, t.verdict] for t in targets(parts, rows, gpu)])
    lines += ["", "## Training steps: predicted vs measured", ""] + _train_table(rows)
    lines += ["", "## FP8 training steps: predicted vs measured (not stored)", ""] \
        + _variant_table(parts, "fp8", "recipe and policy")
    lines += ["", "## Compiled training steps: predicted vs measured (not stored)", ""] \
        + _variant_table(parts, "compile", "blocks and policy")
    lines += ["", "## What inductor fuses in one compiled block", ""] + _kernels_table(parts)
    lines += ["", "## Block recompute steps: predicted vs measured (not stored)", ""] \
        + _variant_table(parts, "block", "policy")
    lines += ["", "## Ledger vs probe (bytes kept for backward)", ""]
    lines += _ledger_section(parts.get("ledger", {}).get("result", {}).get("checks", []))
    lines += ["", "## Masked SDPA (what a sliding-window layer's kernel keeps)", ""]
    lines += _table(["probe", "status", "kernel", "kept beyond q, k, v", "only measured", "only the rule"],
                    [[p["label"], p["status"], p.get("kernel", "-"),
                      ", ".join(f"{t['op']} {'x'.join(map(str, t['shape']))} {t['dtype']}" for t in p.get("kept", [])),
                      ", ".join(p.get("only_measured", [])) or "-",
                      ", ".join(p.get("only_rule", [])) or p.get("message", "-")]
                     for p in parts.get("environment", {}).get("result", {}).get("sdpa_masked", [])])
    lines += ["", "## Matmul", ""]
    lines += _table(["dtype", "shape", "TFLOP/s", "of dense peak", "calls/sample", "clock"],
                    [[r.dtype + (" fast-accum" if (r.details or {}).get("use_fast_accum") else ""), f"{r.m}x{r.n}x{r.k}",
                      f"{r.tflop_per_s:,.2f}" if r.tflop_per_s else r.status,
                      f"{r.peak_fraction:.0%}" if r.peak_fraction else "-",
                      (r.details or {}).get("calls_per_sample", "-"), _clock(r)] for r in rows.matmul])
    lines += ["", "## Memory-bound ops", ""]
    lines += _table(["op", "dtype", "MiB", "GB/s", "clock"],
                    [[r.op, r.dtype, f"{r.elements * (2 if r.dtype == 'bf16' else 4) / 2**20:,.0f}",
                      f"{r.gb_per_s:,.1f}" if r.gb_per_s else r.status, _clock(r)] for r in rows.elementwise])
    lines += ["", "## Attention", ""]
    lines += _table(["backend", "kernel that ran", "shape", "forward ms", "backward ms", "note"],
                    [[r.backend, (r.details or {}).get("kernel", "-"), f"b{r.batch} s{r.seq_len} a{r.n_heads} d{r.head_dim}",
                      f"{r.forward_median_s * 1e3:.3f}" if r.forward_median_s else "-",
                      f"{r.backward_median_s * 1e3:.3f}" if r.backward_median_s else "-",
                      (r.message or "")[:160]] for r in rows.attention])
    regret = parts.get("regret", {}).get("result", {})
    if regret:
        lines += ["", "## Plans and regret", "", f"Calibration: {regret.get('calibration', {}).get('confidence')}", ""]
        lines += [f"- {entry}" for entry in regret.get("plans", [])]
    return "\n".join(lines) + "\n"


def summary(parts: dict[str, dict[str, Any]], rows: Rows, gpu: bool) -> str:
    env = parts.get("environment", {}).get("result", {})
    fp = env.get("fingerprint", {})
    lines = [f"gpu check: {fp.get('device_name', '?')}, torch {fp.get('torch_version')}, CUDA {env.get('cuda')}, "
             f"cuDNN {env.get('cudnn')}, driver {fp.get('driver_version')}",
             "SDPA picks: " + "; ".join(f"{k} -> {v}" for k, v in env.get("sdpa", {}).items())]
    for name, p in parts.items():
        lines.append(f"  {name:<12}{p.get('status', '?'):<9}{p.get('seconds', 0):>7.1f} s  {(p.get('message') or '')[:90]}")
    lines.append("targets:")
    for t in targets(parts, rows, gpu):
        lines.append(f"  {t.verdict:<5} {t.name}: {t.measured} (wanted {t.target})"[:220])
    return "\n".join(lines)
