"""The table printed at the end of a run: the best figures per kind, against the datasheet."""

from __future__ import annotations

from headroom.agent.runner import RunReport
from headroom.core.memory.flops import attention_kernel_flops
from headroom.core.specs.hardware import HARDWARE_BY_KEY
from headroom.db.models import (
    AttentionResult,
    CollectiveResult,
    DispatchResult,
    ElementwiseResult,
    MatmulResult,
    TrainStepResult,
)


def summarize(report: RunReport) -> str:
    hw = HARDWARE_BY_KEY.get(report.hardware)
    ok = [row for _, row in report.rows if row.status == "ok"]
    lines = [
        f"run {report.run_id}: {report.device_name} ({report.device_type}, datasheet: {report.hardware}), "
        f"{len(report.rows)} results in {report.seconds:.1f} s: {len(ok)} ok, {report.count('skipped')} skipped, "
        f"{report.count('oom')} out of memory, {report.count('error')} failed",
    ]
    busy = [r for r in ok if ((r.details or {}).get("host") or {}).get("busy")]
    if busy:
        reasons = sorted({why for r in busy for why in r.details["host"]["why"]})
        lines.append(f"busy host: {len(busy)} of {len(ok)} results were measured while the host was busy "
                     f"({'; '.join(reasons[:3])}{'; ...' if len(reasons) > 3 else ''}); their figures may be "
                     "low: flagged noisy (details.host.busy; noisy training steps are left out of calibration); "
                     "rerun on a quiet box, or with --settle 120 to wait up to two minutes for the CPUs to free up")
    matmuls = [r for r in ok if isinstance(r, MatmulResult)]
    if matmuls:
        lines.append("matmul, best per dtype:")
        for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8"):
            rows = [r for r in matmuls if r.dtype == dtype]
            if rows:
                best = max(rows, key=lambda r: r.tflop_per_s)
                peak = f" ({best.peak_fraction:.0%} of dense peak)" if best.peak_fraction else ""
                lines.append(f"  {dtype:<5} {best.tflop_per_s:>10,.4g} TFLOP/s at {best.m}x{best.n}x{best.k}{peak}")
    elementwise = [r for r in ok if isinstance(r, ElementwiseResult)]
    if elementwise:
        lines.append("elementwise bandwidth (read + write):")
        for r in elementwise:
            share = f" ({r.gb_per_s * 1e9 / hw.hbm_bytes_per_s:.0%} of datasheet)" if hw else ""
            lines.append(f"  {r.op:<10} {r.gb_per_s:>10,.1f} GB/s{share}")
    attention = [r for r in ok if isinstance(r, AttentionResult)]
    if attention:
        lines.append("attention (causal: the masked half not counted, as FlashAttention's benchmarks count it):")
        for r in attention:
            flops = attention_kernel_flops(r.batch, r.seq_len, r.n_heads, r.head_dim, r.causal)
            bwd = f", backward {r.backward_median_s * 1e3:,.2f} ms" if r.backward_median_s else ""
            lines.append(
                f"  {r.backend:<9} b{r.batch} s{r.seq_len} a{r.n_heads} d{r.head_dim}: forward "
                f"{r.forward_median_s * 1e3:,.2f} ms = {flops / r.forward_median_s / 1e12:,.4g} TFLOP/s{bwd}"
            )
    dispatch = {r.mode: r.median_s for r in ok if isinstance(r, DispatchResult)}
    if dispatch:
        what = {"forward": "a forward op", "backward": "a backward kernel",
                "selective-checkpoint": "more an op under a selective-checkpoint context"}
        lines.append("host dispatch (the plan's host term): " + ", ".join(
            f"{seconds * 1e6:,.1f} us {what[mode]}" for mode, seconds in dispatch.items()))
    steps = [(c, r) for c, r in report.rows if isinstance(r, TrainStepResult) and r.status in ("ok", "oom")]
    if steps:
        lines.append(f"training steps: {'configuration':<52}{'step s':>9}{'tokens/s':>11}{'MFU':>6}"
                     f"{'peak GB':>9}{'pred GB':>9}{'act. vs ledger':>16}")
        for case, r in steps:
            if r.status == "oom":
                reached = f"{r.peak_allocated_bytes / 1e9:,.1f}" if r.peak_allocated_bytes else "-"
                lines.append(f"  {case.name:<66} out of memory at {reached} GB (predicted {r.predicted_peak_bytes / 1e9:,.1f})")
                continue
            mfu = f"{r.mfu:.0%}" if r.mfu else "-"
            peak = f"{r.peak_allocated_bytes / 1e9:,.2f}" if r.peak_allocated_bytes else "-"
            act = f"{r.activation_bytes / r.predicted_activation_bytes - 1:+.2%}" if r.predicted_activation_bytes else "-"
            lines.append(f"  {case.name:<64}{r.median_s:>9.4f}{r.tokens_per_s:>11,.0f}{mfu:>6}{peak:>9}"
                         f"{r.predicted_peak_bytes / 1e9:>9,.2f}{act:>16}")
            if r.world_size > 1 and r.communication_median_s is not None:
                predicted = (f"{r.predicted_communication_s * 1e3:,.2f} ms predicted"
                             if r.predicted_communication_s is not None else "no time prediction")
                lines.append(f"    exposed communication {r.communication_median_s * 1e3:,.2f} ms a step ({predicted})")
    collectives = [r for r in ok if isinstance(r, CollectiveResult)]
    if collectives:
        lines.append("collectives (nccl-tests bandwidths; latency = time of the smallest message):")
        for op in dict.fromkeys(r.op for r in collectives):
            rows = sorted((r for r in collectives if r.op == op), key=lambda r: r.message_bytes)
            big = rows[-1]
            lines.append(f"  {op:<15} x{big.group_size}: bus {big.busbw_gb_per_s:>9,.2f} GB/s, "
                         f"alg {big.algbw_gb_per_s:>9,.2f} GB/s at {big.message_bytes / 2**20:,.0f} MiB; "
                         f"latency {rows[0].median_s * 1e6:,.1f} us")
    problems = [(c, row) for c, row in report.rows if row.status in ("oom", "error")
                or (row.status == "skipped" and isinstance(row, TrainStepResult))]
    for case, row in problems:
        lines.append(f"  {row.status}: {case.name}: {row.message}")
    return "\n".join(lines)
