"""benchmarks/gpu_check.py end to end on the CPU: the code paths a GPU run takes, at toy sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.xdist_support import once_per_run

pytest.importorskip("torch")
from headroom.db.bundle import check_runs, read_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The kit run once on the CPU: its process and the folder it wrote."""
    def build(out: Path) -> dict:
        # Budgets tripled: beside a busy test worker a part can run out of time and leave a case not run (the
        # budgets guard a GPU's 15 minutes; here the check is that every part works).
        proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--out", str(out),
                               "--budget-scale", "3"],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        return {"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                "out": str(out)}

    run = once_per_run(tmp_path_factory, "gpu-check", build)
    return subprocess.CompletedProcess(run["args"], run["returncode"], run["stdout"], run["stderr"]), Path(run["out"])


@pytest.mark.slow
def test_every_part_runs_and_writes_bundle_report_checks_and_log(check_run):
    proc, out = check_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (md,) = out.glob("*.md")
    stem = md.name.removesuffix(".md")
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}{ext}" for ext in (".checks.json", ".json.gz", ".log", ".md"))
    parts = json.loads((out / f"{stem}.checks.json").read_text())
    assert list(parts) == ["environment", "ledger", "suite", "offload", "repeat", "fp8", "compile", "block",
                           "regret", "multi-rank"]
    assert {name: p["status"] for name, p in parts.items()} == dict.fromkeys(parts, "ok")
    runs = list(check_runs(read_runs(out / f"{stem}.json.gz"), "gpu check bundle"))
    assert [r.run["suite"] for r in runs][0] == "quick"  # then the check's own runs
    assert all(r.fingerprint["device_type"] == "cpu" for r in runs)
    report = md.read_text()
    for section in ("## Targets", "## Training steps: predicted vs measured", "## Ledger vs probe", "## Plans and regret",
                    "## Masked SDPA", "## FP8 training steps", "## Compiled training steps",
                    "## Block recompute steps"):
        assert section in report
    # the bf16 and float8 steps of the same model: every one ran, its saved bytes what the ledger says (a CPU)
    steps = parts["fp8"]["result"]["steps"]
    assert [s["label"] for s in steps] == [f"{r} {p}" for r in ("off", "torchao-tensorwise", "torchao-rowwise")
                                           for p in ("none", "full")]
    assert all(s["status"] == "ok" and s["activation_bytes"] == s["predicted_activation_bytes"] for s in steps), steps
    # and compiled, each block as torchtitan compiles it: what its hooks see is what the ledger says
    compiled = parts["compile"]["result"]["steps"]
    assert [s["label"] for s in compiled] == ["compiled none", "compiled full"]
    assert all(s["status"] == "ok" and s["activation_bytes"] == s["predicted_activation_bytes"]
               and s["first_step_s"] > 0 for s in compiled), compiled
    # then one block compiled alone: inductor fuses the block's memory-bound ops into fewer kernels moving fewer bytes
    kernels = parts["compile"]["result"]["kernels"]
    assert kernels["status"] == "ok" and len(kernels["graphs"]) == 2, kernels
    forward = kernels["graphs"][0]
    assert 0 < forward["kernels"] < kernels["eager_memory_ops"], kernels
    assert 0 < forward["kernel_bytes"] < kernels["eager_memory_bytes"], kernels
    assert forward["externs"] >= 5  # the fused q/k/v, output, gate, up and down projections, and attention
    assert "## What inductor fuses in one compiled block" in report
    # and under block recompute, beside none and full: what its hooks see is what the ledger says
    blocks = parts["block"]["result"]["steps"]
    assert [s["label"] for s in blocks] == ["none", "block-1", "full"]
    assert all(s["status"] == "ok" and s["activation_bytes"] == s["predicted_activation_bytes"] for s in blocks), blocks
    assert blocks[0]["activation_bytes"] > blocks[1]["activation_bytes"] > blocks[2]["activation_bytes"]
    masked = parts["environment"]["result"]["sdpa_masked"]
    assert [(p["label"], p["status"], p["kernel"]) for p in masked] == [
        (f"{dtype} s{s} b1 a8 d128 window 64", "ok", "flash") for dtype in ("bf16", "fp32") for s in (128, 120)]
    assert "| masked SDPA keeps what the CPU's rule says (sliding windows under transformers) | 4/4 probes | all | " \
           "pass |" in report


@pytest.mark.slow
def test_on_the_cpu_every_ledger_check_matches_the_probe(check_run):
    proc, out = check_run
    parts = json.loads(next(out.glob("*.checks.json")).read_text())
    checks = parts["ledger"]["result"]["checks"]
    assert checks and {c["status"] for c in checks} == {"ok"}, [c["label"] for c in checks if c["status"] != "ok"]
    assert {c["kernel"] for c in checks if c["case"]["backend"] == "math"} == {"math"}


@pytest.mark.slow
def test_regret_is_judged_at_80_gb_and_a_tight_budget_is_sought(check_run):
    """At the CPU's smoke sizes every configuration peaks at the optimizer's step (the static state and
    foreach AdamW's copy of the second moments outweigh any micro-batch's activations), so checkpointing
    lowers no peak and no budget rules out the plain configurations alone: the check says so. On a GPU the
    1B sweep's activations decide its peaks and the tight budget is judged (tests/test_regret.py holds
    tight_budget to its rule)."""
    proc, out = check_run
    plans = json.loads(next(out.glob("*.checks.json")).read_text())["regret"]["result"]["plans"]
    roomy, tight = plans
    assert roomy["budget"] == "80 GB"
    assert roomy["outcome"] == "ok" and roomy["fit_by"] == "predicted"  # no allocator on a CPU
    assert roomy["best_tokens_per_s"] >= roomy["recommended_tokens_per_s"] > 0
    assert roomy["regret"] == pytest.approx(1 - roomy["recommended_tokens_per_s"] / roomy["best_tokens_per_s"])
    assert tight == {"budget": "tight", "outcome": "no budget here rules out every configuration without "
                                                   "checkpointing while another fits"}
    summary = proc.stdout
    assert "targets:" in summary and "regret at 80 GB" in summary and "n/a   peak allocated vs predicted" in summary


@pytest.mark.slow
def test_a_part_that_fails_or_overruns_costs_only_itself(tmp_path):
    """A part's process that raises is reported with its last line, one past its budget is killed, and
    the check goes on to the next part."""
    import io
    import multiprocessing

    from benchmarks import gpu_check

    processes = multiprocessing.get_context("forkserver")
    log = io.StringIO()
    foreign = tmp_path / "notes.db"
    foreign.write_text("not a database\n")
    failed = gpu_check.run_part(processes, "offload", 60, "cpu", f"sqlite:///{foreign}", tmp_path, log)
    assert failed["status"] == "failed" and failed["result"] == {}
    assert failed["message"].startswith("exit status 1: ") and "notes.db" in failed["message"], failed["message"]
    store = f"sqlite:///{tmp_path / 'results.db'}"
    killed = gpu_check.run_part(processes, "suite", 0.5 - gpu_check.GRACE_S, "cpu", store, tmp_path, log)
    assert killed["status"] == "killed" and killed["seconds"] < 10
    assert "==== offload (failed" in log.getvalue() and "==== suite (killed" in log.getvalue()


def test_the_masked_sdpa_probe_says_where_a_kernel_parts_from_the_rule(monkeypatch):
    """On a CPU the flash kernel keeps the additive mask, the output and the log-sum-exp, the CPU's rule; judged
    by CUDA's rule (which adds the generator's seed and offset) the same probe differs, and says by what."""
    torch = pytest.importorskip("torch")
    from headroom.agent.check import masked_sdpa

    cpu = torch.device("cpu")
    probed = masked_sdpa.probe_masked(cpu, torch.bfloat16, 120)
    assert (probed["status"], probed["kernel"], probed["only_measured"], probed["only_rule"]) == ("ok", "flash", [], [])
    assert [(t["op"], t["shape"], t["dtype"]) for t in probed["kept"]] == [
        ("where", [1, 1, 120, 120], "bf16"), ("_scaled_dot_product_flash_attention_for_cpu", [1, 8, 120, 128], "bf16"),
        ("_scaled_dot_product_flash_attention_for_cpu", [1, 8, 120], "fp32")]
    rule = masked_sdpa.expected
    monkeypatch.setattr(masked_sdpa, "expected", lambda device, dtype, s: rule(torch.device("cuda"), dtype, s))
    judged = masked_sdpa.probe_masked(cpu, torch.bfloat16, 120)
    assert (judged["status"], judged["only_measured"], judged["only_rule"]) == ("differs", [], ["int64 8 bytes (x2)"])


@pytest.mark.parametrize("scale", ["0", "-1", "inf", "nan", "three", "1e307"])
def test_a_budget_scale_that_is_not_a_positive_number_is_refused(scale):
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--budget-scale", scale, "--parts", "none"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    assert f"argument --budget-scale: must be a positive number up to 100, got {scale!r}" in proc.stderr
