"""The agent on this CPU: the smoke suite end to end, failures recorded, timers."""

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")
from sqlalchemy import select  # noqa: E402

from headroom.agent import bench_matmul  # noqa: E402
from headroom.agent.cases import Case  # noqa: E402
from headroom.agent.runner import run_suite  # noqa: E402
from headroom.agent.suites import build_cases  # noqa: E402
from headroom.agent.timer import cpu_cache_bytes, time_fn  # noqa: E402
from headroom.db.models import (  # noqa: E402
    AttentionResult,
    ElementwiseResult,
    Fingerprint,
    MatmulResult,
    Run,
    TrainStepResult,
)
from headroom.db.store import open_store  # noqa: E402

CPU = torch.device("cpu")


def test_smoke_suite_records_a_completed_run_with_plausible_cpu_figures(smoke_store):
    url = smoke_store.url
    with open_store(url) as store, store.session() as s:
        run = s.scalars(select(Run)).one()
        assert run.status == "completed" and run.finished_at is not None
        fp = s.get(Fingerprint, run.fingerprint_id)
        assert fp.device_type == "cpu" and fp.device_name and fp.torch_version == torch.__version__
        matmul = s.scalars(select(MatmulResult).where(MatmulResult.status == "ok")).all()
        # A 2-core CPU: between 0.1 GFLOP/s and 10 TFLOP/s.
        assert matmul and all(1e-4 < r.tflop_per_s < 10 for r in matmul)
        assert all(len(r.samples_s) >= 3 and r.min_s <= r.median_s <= r.max_s for r in matmul)
        fp8 = s.scalars(select(MatmulResult).where(MatmulResult.dtype == "fp8")).all()
        assert fp8 and all(r.status == "skipped" and "CUDA" in r.message for r in fp8)
        bandwidth = s.scalars(select(ElementwiseResult)).all()
        assert {r.op for r in bandwidth} == {"copy", "add", "relu", "gelu", "layernorm"}
        assert all(0.1 < r.gb_per_s < 1000 for r in bandwidth)
        copy = next(r for r in bandwidth if r.op == "copy")
        assert copy.bytes_moved == 2 * copy.elements * 4  # read + write, fp32
        assert copy.elements * 4 >= 4 * cpu_cache_bytes()  # streams from memory, not the cache
        steps = s.scalars(select(TrainStepResult).where(TrainStepResult.status == "ok")).all()
        for r in [*matmul, *bandwidth, *steps]:  # the host's load and the samples' spread, on every result
            assert {"threads", "other_cpu_fraction", "spread", "busy"} <= set(r.details["host"])
        attention = s.scalars(select(AttentionResult).where(AttentionResult.status == "ok")).all()
        assert attention and all(r.forward_median_s > 0 and r.backward_median_s > 0 for r in attention)


def test_smoke_training_steps_match_the_ledger(smoke_store):
    url = smoke_store.url
    with open_store(url) as store, store.session() as s:
        steps = s.scalars(select(TrainStepResult)).all()
    assert len(steps) == 10  # 2 micro-batches x 5 policies
    for row in steps:
        assert row.status == "ok", row.message
        assert row.activation_bytes == pytest.approx(row.predicted_activation_bytes, rel=0.02)
        assert row.tokens_per_s > 0 and row.optimizer_median_s < row.median_s
        assert row.predicted_step_time_s is not None  # from this run's own matmul and bandwidth rows


def _boom(device):
    raise RuntimeError("injected failure")


def _oom(device):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


def test_a_failing_case_is_recorded_and_the_suite_goes_on(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    good = bench_matmul.case("fp32", 64, 64, 64, budget_s=0.05)
    failing = Case("matmul", "broken", 0.1, _boom, lambda status, message: MatmulResult(
        dtype="fp32", m=1, n=1, k=1, status=status, message=message))
    oom = Case("matmul", "too big", 0.1, _oom, lambda status, message: MatmulResult(
        dtype="fp32", m=2, n=2, k=2, status=status, message=message))
    with open_store(url, mode="write") as store:
        report = run_suite(store, CPU, "smoke", quiet=True, cases=[failing, oom, good])
    assert [row.status for _, row in report.rows] == ["error", "oom", "ok"]
    with open_store(url) as store, store.session() as s:
        assert s.scalars(select(Run.status)).one() == "completed"
        rows = s.scalars(select(MatmulResult).order_by(MatmulResult.id)).all()
        assert [r.status for r in rows] == ["error", "oom", "ok"]
        assert "injected failure" in rows[0].message and "out of memory" in rows[1].message


def test_ctrl_c_aborts_the_run_and_keeps_finished_results(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"

    def interrupt(device):
        raise KeyboardInterrupt

    stop = Case("matmul", "ctrl-c", 0.1, interrupt, lambda s, m: None)
    with open_store(url, mode="write") as store, pytest.raises(KeyboardInterrupt):
        run_suite(store, CPU, "smoke", quiet=True, cases=[bench_matmul.case("fp32", 64, 64, 64, budget_s=0.05), stop])
    with open_store(url) as store, store.session() as s:
        assert s.scalars(select(Run.status)).one() == "aborted"
        assert len(s.scalars(select(MatmulResult)).all()) == 1


def test_a_broken_cuda_context_records_the_rest_as_not_run_and_fails_the_run(tmp_path, monkeypatch):
    """A sticky CUDA error surfaces when the runner settles the device after a case (simulated here)."""
    from headroom.agent import runner

    calls = []

    def settle(device):
        calls.append(device)
        if len(calls) == 2:
            raise runner.DeviceLost("AcceleratorError: CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(runner, "settle", settle)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cases = [bench_matmul.case("fp32", 32, 32, 32, label=str(i), budget_s=0.01) for i in range(4)]
    with open_store(url, mode="write") as store, pytest.raises(runner.DeviceLost) as lost:
        run_suite(store, CPU, "smoke", quiet=True, cases=cases)
    assert "the CUDA context broke during 'fp32 1 32x32x32'" in str(lost.value) and "2 later case(s)" in str(lost.value)
    assert [row.status for _, row in lost.value.report.rows] == ["ok", "ok", "error", "error"]
    with open_store(url) as store, store.session() as s:
        assert s.scalars(select(Run.status)).one() == "failed"
        rows = s.scalars(select(MatmulResult).order_by(MatmulResult.id)).all()
        assert [r.status for r in rows] == ["ok", "ok", "error", "error"]
        assert all("not run: the CUDA context broke during 'fp32 1 32x32x32'" in r.message for r in rows[2:])


def test_host_timer_keeps_every_sample_and_respects_its_budget():
    calls = []
    timing = time_fn(lambda i: (calls.append(i), time.sleep(0.01)), CPU, iterations=50, budget_s=0.1)
    assert calls == list(range(len(calls)))  # one running index across warm-up and samples, for input rotation
    assert timing.calls_per_sample == 1  # a 10 ms call is a block on its own
    assert 5 <= len(timing.samples_s) <= 12  # 0.1 s of 10 ms samples, at least min_iterations
    assert all(s >= 0.01 for s in timing.samples_s)
    assert timing.min_s <= timing.median_s <= timing.max_s


class _FakeClock:
    """headroom.agent.timer's clock, advanced only by the timed function: timing that cannot depend on the scheduler."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_calls_shorter_than_a_block_are_timed_back_to_back(monkeypatch):
    """A 61 us call (2^-14 s, exact in binary) is timed in blocks of about 1 ms, 17 calls; each sample is the
    block's time per call."""
    from headroom.agent import timer

    clock = _FakeClock()
    monkeypatch.setattr(timer, "time", clock)

    def call(i: int) -> None:
        clock.now += 2**-14

    timing = time_fn(call, CPU, budget_s=0.01)
    assert timing.calls_per_sample == 17  # ceil(1 ms / 61 us)
    assert len(timing.samples_s) == 10  # the budget, 10 ms, spent in blocks of 1.04 ms
    assert timing.median_s == pytest.approx(2**-14, rel=1e-9)
    details = timing.details()
    assert set(details) == {"calls_per_sample", "host"}  # no GPU: no clocks
    assert details["calls_per_sample"] == timing.calls_per_sample
    assert details["host"]["threads"] == torch.get_num_threads() and details["host"]["cpus"] == os.cpu_count()


def test_suite_kinds_are_validated():
    from headroom.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown benchmark kind.*bogus.*valid: matmul, elementwise, attention, dispatch, train"):
        build_cases("smoke", CPU, ("bogus",))


def test_every_suite_the_cli_offers_is_built():
    """headroom.agent.names holds the names the CLI parses without torch; headroom.agent.suites builds each."""
    from headroom.agent.names import SUITES
    from headroom.agent.suites import GPU_SUITES, suite_size

    assert tuple(GPU_SUITES) == SUITES
    assert all(suite_size(suite, CPU) is not None for suite in SUITES)


def test_agent_json_is_the_bundle_of_what_it_measured(run_cli, tmp_path):
    db, elsewhere = f"sqlite:///{tmp_path / 'box.db'}", f"sqlite:///{tmp_path / 'fleet.db'}"
    train = run_cli("agent", "train", "--model", "bench-llama-tiny", "--seq-len", "32", "--micro-batch", "1",
                     "--recompute", "none,full", "--steps", "2", "--device", "cpu", "--db", db, "--quiet", "--json")
    assert train.returncode == 0, train.stderr
    bundle = json.loads(train.stdout)
    (run,) = bundle["runs"]
    assert bundle["format"] == "headroom-bundle" and run["status"] == "completed"
    assert [r["recompute"] for r in run["results"]["train_step"]] == ["none", "full"]
    (tmp_path / "run.json").write_text(train.stdout)
    imported = run_cli("db", "import", str(tmp_path / "run.json"), "--db", elsewhere)
    assert imported.returncode == 0 and "added 1 runs" in imported.stdout, imported.stdout + imported.stderr


def test_agent_commands_from_the_cli(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # the summary's first line names the CPU: wrapped, where is the host's
    db = f"sqlite:///{tmp_path / 'headroom.cli.db'}"
    train = run_cli("agent", "train", "--model", "bench-llama-tiny", "--seq-len", "32", "--micro-batch", "1,2",
                     "--recompute", "none,full", "--steps", "2", "--device", "cpu", "--db", db, "--quiet")
    assert train.returncode == 0, train.stderr
    assert train.stdout.count("bench-llama-tiny s32 micro") == 4
    # Attention: the cheapest kind on a CPU (the smoke store's run covers every kind).
    run = run_cli("agent", "run", "--suite", "smoke", "--only", "attention", "--device", "cpu", "--db", db,
                   "--label", "rack=b7", "--quiet")
    assert run.returncode == 0, run.stderr
    assert "2 results" in run.stdout and "  flash     b1 s256 a8 d64: forward" in run.stdout
    with open_store(db) as store, store.session() as s:
        assert sorted(s.scalars(select(Run.suite)).all()) == ["smoke", "train"]
        assert {"rack": "b7"} in s.scalars(select(Run.labels)).all()


@pytest.mark.parametrize(("flags", "message"), [
    (("--device", "cuda:0"), "no CUDA device is visible here; use --device cpu"),
    (("--device", "cpu", "--only", "matmul,bogus"), "--only 'matmul,bogus': unknown kind(s) bogus; valid: matmul,"),
    (("--device", "cpu", "--only", ","), "--only ',': names no kind"),
])
def test_agent_run_refuses_a_missing_device_or_unknown_kinds_before_any_work(flags, message, tmp_path, capsys):
    from headroom.cli.main import main

    if flags[1].startswith("cuda") and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    db = tmp_path / "refused.db"
    assert main(["agent", "run", *flags, "--db", f"sqlite:///{db}"]) == 2
    assert message in capsys.readouterr().err
    assert not db.exists()  # refused before the store was opened


@pytest.mark.parametrize("stack", ["megatron", "hf", "hf-liger"])
def test_agent_train_refuses_a_stack_whose_kernels_its_decoder_does_not_run(stack, tmp_path, capsys):
    from headroom.cli.main import main

    db = tmp_path / "refused.db"
    flags = ["agent", "train", "--model", "bench-llama-tiny", "--seq-len", "32", "--device", "cpu", "--stack", stack]
    assert main([*flags, "--db", f"sqlite:///{db}"]) == 2
    assert (f"--stack {stack}: the agent's decoder runs the reference stack's kernels, not {stack}'s, so it measures "
            f"--stack reference or torchtitan; {stack} is planned, not measured (headroom plan --stack {stack})"
            in capsys.readouterr().err)
    assert not db.exists()


def test_agent_train_refuses_torchtitans_loss_under_tensor_parallelism(tmp_path, capsys):
    from headroom.cli.main import main

    db = tmp_path / "refused.db"
    flags = ["agent", "train", "--model", "bench-llama-tiny", "--seq-len", "32", "--device", "cpu", "--nproc", "2",
             "--tp", "2", "--stack", "torchtitan"]
    assert main([*flags, "--db", f"sqlite:///{db}"]) == 2
    assert ("--stack torchtitan --tp 2: under tensor parallelism torchtitan computes its loss with its own function, "
            "which the agent's decoder does not run (its loss is torch's loss_parallel, the reference's); measure "
            "--stack reference, or plan it (headroom plan --stack torchtitan)" in capsys.readouterr().err)
    assert not db.exists()


def test_an_attention_backend_that_declines_is_skipped_with_torchs_reason_and_oom_is_oom(monkeypatch):
    from headroom.agent import bench_attention
    from headroom.agent.runner import run_case

    declined = bench_attention.measure(CPU, "efficient", "fp32", 1, 64, 2, 16, budget_s=0.01)
    assert declined.status == "skipped" and declined.message.startswith("efficient cannot run this shape here: ")
    ran = bench_attention.measure(CPU, "flash", "fp32", 1, 64, 2, 16, budget_s=0.01)
    assert ran.status == "ok" and ran.details["kernel"] == "flash"  # the kernel that really ran

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB (injected)")

    monkeypatch.setattr(bench_attention.F, "scaled_dot_product_attention", out_of_memory)
    (case,) = [c for c in bench_attention.cases(CPU, [(1, 64, 2, 16)], 0.01) if c.name.startswith("flash")]
    row = run_case(case, CPU)
    assert row.status == "oom" and "injected" in row.message  # not "skipped": memory is not a missing backend


def test_the_host_dispatch_is_measured_per_op_in_each_mode():
    """headroom.agent.bench_dispatch on this CPU: three ok rows, one a mode, each sample seconds per op of a chain of 256,
    and what the selective-checkpoint context adds never negative; the core turns them into the box's HostCosts."""
    import torch

    from headroom.agent import bench_dispatch
    from headroom.core.measured.measurements import DispatchRecord, host_costs
    from headroom.db.models import DISPATCH_MODES

    rows = [case.measure(torch.device("cpu")) for case in bench_dispatch.cases(torch.device("cpu"))]
    assert [r.mode for r in rows] == list(DISPATCH_MODES) and all(r.status == "ok" for r in rows)
    assert all(r.ops == bench_dispatch.CHAIN and len(r.samples_s) == bench_dispatch.SAMPLES for r in rows)
    assert all(r.min_s <= r.median_s <= r.max_s and r.min_s >= 0 for r in rows)
    assert rows[0].median_s > 0 and rows[1].median_s > 0
    from headroom.agent.runner import RunReport
    from headroom.agent.summary import summarize

    cases = bench_dispatch.cases(torch.device("cpu"))
    text = summarize(RunReport("run", "cpu", "unknown", "cpu", rows=list(zip(cases, rows, strict=True))))
    assert (f"host dispatch (the plan's host term): {rows[0].median_s * 1e6:,.1f} us a forward op, "
            f"{rows[1].median_s * 1e6:,.1f} us a backward kernel, ") in text
    costs = host_costs([DispatchRecord(r.mode, r.median_s) for r in rows], "this CPU")
    assert (costs.forward_op_s, costs.backward_op_s, costs.selective_checkpoint_op_s) == tuple(r.median_s for r in rows)
    assert host_costs([DispatchRecord("forward", 1e-6)], "x") is None  # all three or none
