"""The agent on several ranks: collectives and training steps under real torch.distributed (gloo, CPU).

One store is built once per session (about 35 s on 2 cores): the session's smoke run for a CPU
profile, the collectives over 2 ranks (`headroom agent run --only collectives --nproc 2`, the command
run in this process, its ranks launched), FSDP2 steps at two micro-batch sizes in one launch (`headroom
agent train --nproc 2 --zero 3 --micro-batch 1,2`), then tensor + sequence parallelism, a 2-stage
1F1B pipeline of 4 micro-batches, a GPipe one of 3, uneven stages and a zero-bubble ZB-V pipeline, one launch for
them (headroom.agent.train_ranks.cases);
every rank its own row. Each launch is killed when its ranks go quiet for its timeout, and every
collective runs under the process group's timeout. Tests that start processes are marked ``slow``:
``pytest -m "not slow"`` leaves them out for local work.
"""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import time
from contextlib import closing, redirect_stderr, redirect_stdout

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch was built without torch.distributed or gloo", allow_module_level=True)

from sqlalchemy import select  # noqa: E402

from headroom.agent import bench_collectives, train_ranks  # noqa: E402
from headroom.agent.bench_train import TrainSetup  # noqa: E402
from headroom.agent.runner import run_suite  # noqa: E402
from headroom.cli.main import main  # noqa: E402
from headroom.core.measured.measurements import step_observations  # noqa: E402
from headroom.core.memory.estimate import EMBEDDING_ONLY, estimate, for_rank  # noqa: E402
from headroom.core.memory.ledger import activation_ledger, chunk_device_bytes  # noqa: E402
from headroom.core.memory.pipeline import v_peak  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from headroom.core.specs.stages import rank_chunks  # noqa: E402
from headroom.core.timing.collective_ops import bus_factor  # noqa: E402
from headroom.core.timing.comm import MEASURED, step_communication  # noqa: E402
from headroom.db.models import CollectiveResult, Run, TrainStepResult  # noqa: E402
from headroom.db.profiles import find_device, measured_in, train_step_records  # noqa: E402
from headroom.db.store import open_store  # noqa: E402
from tests.xdist_support import once_per_run  # noqa: E402

MODEL = "bench-llama-tiny"
TRAIN_FLAGS = ("--model", MODEL, "--device", "cpu", "--seq-len", "64", "--micro-batch", "2", "--steps", "3")
CPU = torch.device("cpu")


@pytest.fixture(scope="session")
def fleet(tmp_path_factory, smoke_store):
    """(url, the collectives command's output, the FSDP2 command's output): one store, built once per run."""
    def build(folder):
        path = folder / "results.db"
        url = f"sqlite:///{path}"
        # A CPU profile: the session's smoke run (matmul, elementwise, attention rates and one-device
        # steps), copied with SQLite's backup API rather than measured again.
        with closing(sqlite3.connect(smoke_store.url.removeprefix("sqlite:///"))) as source, \
                closing(sqlite3.connect(path)) as copy:
            source.backup(copy)
        collectives = _headroom("agent", "run", "--only", "collectives", "--nproc", "2", "--device", "cpu",
                                "--db", url, "--quiet")
        # Two micro-batch sizes under FSDP2: one command, one launch.
        fsdp = _headroom("agent", "train", *FSDP_FLAGS, "--db", url, "--quiet")
        with open_store(url, mode="write") as store:
            with store.session() as session:
                profile, _ = measured_in(session, "latest")
            run_suite(store, CPU, "train", cases=train_ranks.cases(SWEEP, "cpu", profile), quiet=True)
        return [url, collectives, fsdp]

    return once_per_run(tmp_path_factory, "fleet", build)


FSDP_FLAGS = ("--model", MODEL, "--device", "cpu", "--seq-len", "64", "--micro-batch", "1,2", "--steps", "3",
              "--nproc", "2", "--zero", "3")
SWEEP = [TrainSetup(spec=get_preset(MODEL), steps=3, accumulation_steps=accumulation, config=TrainConfig(
    seq_len=64, micro_batch=2, precision="fp32", layout=layout)) for accumulation, layout in (
    (1, Layout(tp=2, sp=True)),
    (4, Layout(pp=2)),  # 1F1B, 4 micro-batches
    (3, Layout(pp=2, schedule="gpipe")),
)] + [TrainSetup(spec=get_preset("bench-llama-small"), steps=3, accumulation_steps=accumulation, config=TrainConfig(
    seq_len=64, micro_batch=2, precision="fp32", layout=layout)) for accumulation, layout in (
    (2, Layout(pp=2, stage_layers=(1, 3))),
    (4, Layout(pp=2, schedule="zbv", virtual_stages=2)),  # ZB-V: 4 chunks of one block, rank 0 holds 0 and 3
)] + [TrainSetup(spec=get_preset(MODEL), steps=3, accumulation_steps=2, config=TrainConfig(
    seq_len=64, micro_batch=2, precision="fp32", layout=Layout(dp=2, zero=3, reshard_after_forward=False)))]
# the last: plain PyTorch's ZeRO-2, FSDP kept gathered from forward to backward
"""Six setups of two ranks, measured by one launch (headroom.agent.train_ranks.Launches)."""


def _headroom(*args: str) -> str:
    """The command's stdout, run in this process: the ranks it launches are processes of their own."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    assert code == 0, err.getvalue()
    return out.getvalue()


def _rows(url: str, model):
    with open_store(url) as store, store.session() as session:
        return list(session.scalars(select(model).order_by(model.id)))


# ---- collectives ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_collective_is_measured_at_every_size(fleet):
    rows = _rows(fleet[0], CollectiveResult)
    assert [(r.op, r.message_bytes) for r in rows] == [
        (op, size) for op in bench_collectives.OPS for size in bench_collectives.CPU_SIZES]
    assert {(r.status, r.backend, r.dtype, r.group_size) for r in rows} == {("ok", "gloo", "fp32", 2)}


@pytest.mark.slow
def test_bandwidths_are_nccl_tests_arithmetic(fleet):
    for r in _rows(fleet[0], CollectiveResult):
        assert len(r.samples_s) == bench_collectives.SAMPLES["cpu"] and all(s > 0 for s in r.samples_s)
        assert r.median_s == sorted(r.samples_s)[len(r.samples_s) // 2]
        assert r.algbw_gb_per_s == r.message_bytes / r.median_s / 1e9
        assert r.busbw_gb_per_s == r.algbw_gb_per_s * bus_factor(r.op, 2)
        assert r.details["calls_per_sample"] >= 1


@pytest.mark.slow
def test_the_run_summary_names_each_collective(fleet):
    out = fleet[1]
    for op in bench_collectives.OPS:
        assert f"  {op:<15} x2: bus " in out


@pytest.mark.slow
def test_a_killed_rank_ends_the_launch_with_errors_not_a_hang(tmp_path):
    """SIGKILL one rank after the first result: the launch ends promptly, and from the first case the dead
    rank could not finish on, every case is recorded as an error.

    The ranks run ahead of the parent (they print each result as it is measured), so a case or two after the
    first may already be measured when the kill lands: those are stored as measured. Which cases that is
    depends on the scheduler; that no case after the first error is ``ok`` does not.
    """
    cases = bench_collectives.cases("cpu", 2, message_sizes=(1024, 2**20), timeout_s=120)
    first = cases[0].measure(CPU)
    assert first.status == "ok"
    launch = _launch_of(cases[0])
    ranks = _children(launch.process.pid)
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    started = time.monotonic()
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    with open_store(url, mode="write") as store:
        report = run_suite(store, CPU, "quick", cases=cases[1:], quiet=True)
    assert time.monotonic() - started < 60
    statuses = [row.status for _, row in report.rows]
    measured = statuses.count("ok")
    assert measured < len(statuses) and statuses == ["ok"] * measured + ["error"] * (len(statuses) - measured)
    assert "the launch exited with code 1" in report.rows[-1][1].message
    assert {r.status for r in _rows(url, Run)} == {"completed"}


def _launch_of(case):
    """The Launch a collective case reads its row from (the closure of its measure function)."""
    from headroom.agent.launch import Launch

    cells = case.measure.func.__closure__ or ()
    return next(c.cell_contents for c in cells if isinstance(c.cell_contents, Launch))


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.mark.slow
def test_four_ranks_measure_every_collective():
    for case in bench_collectives.cases("cpu", 4, message_sizes=(4096, 2**18)):
        row = case.measure(CPU)
        assert row.status == "ok" and row.group_size == 4, row.message
        assert row.busbw_gb_per_s == row.message_bytes / row.median_s / 1e9 * bus_factor(row.op, 4)


# ---- multi-rank training steps ------------------------------------------------------------------------------


def _steps(url: str, layout: dict, micro_batch: int = 2) -> list[TrainStepResult]:
    return [r for r in _rows(url, TrainStepResult) if r.layout and r.micro_batch == micro_batch
            and all(r.layout[k] == v for k, v in layout.items())]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"dp": 2, "zero": 3, "reshard_after_forward": None}, {"tp": 2, "sp": True},
                                    {"pp": 2, "schedule": "1f1b", "stage_layers": None},
                                    {"pp": 2, "schedule": "gpipe"}, {"pp": 2, "stage_layers": [1, 3]},
                                    {"dp": 2, "zero": 3, "reshard_after_forward": False}],
                         ids=["fsdp2", "tp2-sp", "pp2-1f1b", "pp2-gpipe", "pp2-stages-1-3", "fsdp2-kept-gathered"])
def test_each_rank_is_a_row_with_the_core_prediction_for_it(fleet, layout):
    rows = _steps(fleet[0], layout)
    assert [(r.rank, r.world_size, r.status) for r in rows] == [(0, 2, "ok"), (1, 2, "ok")]
    for r in rows:
        assert r.activation_bytes == r.predicted_activation_bytes, r.details["probe"]
        assert r.details["parameter_bytes"] == r.prediction["memory_bytes"]["parameters"]
        assert r.communication_median_s > 0 and len(r.samples_s) == 3


@pytest.mark.slow
def test_fsdp_units_stay_gathered_after_forward_as_the_layout_says(fleet):
    """Resharded after forward, only the unit of the final norm and the head stays gathered (backward needs it
    first); kept gathered (plain PyTorch's ZeRO-2, FSDP's SHARD_GRAD_OP), every unit does, as FSDP2 reports it."""
    head = ["final_norm", "lm_head"]
    kept = sorted(["embed", *(f"blocks.{i}" for i in range(get_preset(MODEL).n_layers)), *head])
    for reshard, gathered in ((None, head), (False, kept)):
        rows = _steps(fleet[0], {"dp": 2, "zero": 3, "reshard_after_forward": reshard})
        assert [r.rank for r in rows] == [0, 1]
        assert all(r.details["fsdp_units_gathered_after_forward"] == gathered for r in rows), rows[0].details


@pytest.mark.slow
def test_fsdp_ranks_hold_the_predicted_gradient_shard(fleet):
    for r in _steps(fleet[0], {"dp": 2, "zero": 3}):
        assert r.details["gradient_bytes"] == r.prediction["memory_bytes"]["gradients"]
        # AdamW's two fp32 moments of each shard, plus one 4-byte step counter per parameter tensor
        tensors = len(r.details["gradient_shards"])
        assert r.details["optimizer_state_bytes"] == r.prediction["memory_bytes"]["optimizer_states"] + 4 * tensors


@pytest.mark.slow
def test_pipeline_stages_hold_their_layers_gradients_and_micro_batches_in_flight(fleet):
    """Stage 0 of a 2-stage 1F1B pipeline keeps pp - 0 = 2 micro-batches' activations at once, stage 1
    one (headroom.core.memory.pipeline.in_flight); each holds its own blocks, embedding or head, and their gradients."""
    rows = _steps(fleet[0], {"pp": 2, "schedule": "1f1b", "stage_layers": None})
    assert [r.prediction["rank"] for r in rows] == ["first stage", "last stage"]
    for r, in_flight in zip(rows, (2, 1), strict=True):
        assert r.accumulation_steps == 4 and r.layout["schedule"] == "1f1b"
        measured = r.details["in_flight"]
        assert measured["saved_peak_bytes"] == in_flight * measured["saved_micro_batch_bytes"]
        assert measured["micro_batches_in_flight"] == in_flight
        assert _predicted_in_flight(r) == in_flight
        assert r.details["gradient_bytes"] == r.prediction["memory_bytes"]["gradients"]
    first, last = rows
    assert "embed.weight" in first.details["gradient_shards"] and "lm_head.weight" in last.details["gradient_shards"]


@pytest.mark.slow
def test_uneven_stages_hold_the_blocks_they_are_given(fleet):
    """--stage-layers 1,3 on a 4-layer model, 1F1B over 2 micro-batches: the first stage holds the embedding and
    one block with 2 micro-batches in flight, the last three blocks and the head with one; each holds its own
    blocks' parameters and gradients, and saves what the core predicts for its stage, byte for byte."""
    rows = _steps(fleet[0], {"pp": 2, "stage_layers": [1, 3]})
    assert [(r.rank, r.prediction["rank"], r.status) for r in rows] == [(0, "first stage", "ok"),
                                                                         (1, "last stage", "ok")]
    for r, layers, in_flight in zip(rows, (1, 3), (2, 1), strict=True):
        assert next(k["layers"] for k in r.prediction["ranks"] if k["rank"] == r.prediction["rank"]) == layers
        assert r.activation_bytes == r.predicted_activation_bytes, r.details["probe"]
        assert r.details["parameter_bytes"] == r.prediction["memory_bytes"]["parameters"]
        assert r.details["gradient_bytes"] == r.prediction["memory_bytes"]["gradients"]
        measured = r.details["in_flight"]
        assert measured["micro_batches_in_flight"] == in_flight == _predicted_in_flight(r)
        assert measured["saved_peak_bytes"] == in_flight * measured["saved_micro_batch_bytes"]
    first, last = rows
    blocks = {name.split(".")[1] for name in first.details["gradient_shards"] if name.startswith("blocks.")}
    assert blocks == {"0"} and "embed.weight" in first.details["gradient_shards"]
    assert {name.split(".")[1] for name in last.details["gradient_shards"] if name.startswith("blocks.")} == {"0", "1", "2"}
    # One block against three: the first stage idles while the last runs, and its predicted wait says so.
    assert first.predicted_communication_s > last.predicted_communication_s


def _predicted_in_flight(row: TrainStepResult) -> float:
    """The micro-batches in flight the core predicted for the row's rank, as stored with it."""
    return next(k["micro_batches_in_flight"] for k in row.prediction["ranks"] if k["rank"] == row.prediction["rank"])


@pytest.mark.slow
def test_a_gpipe_stage_holds_every_micro_batch(fleet):
    """GPipe runs all m forwards before any backward: both stages hold m = 3 micro-batches."""
    rows = _steps(fleet[0], {"pp": 2, "schedule": "gpipe"})
    assert [(r.rank, r.accumulation_steps) for r in rows] == [(0, 3), (1, 3)]
    for r in rows:
        assert r.details["in_flight"]["micro_batches_in_flight"] == 3
        assert _predicted_in_flight(r) == 3


@pytest.mark.slow
def test_a_sweep_of_one_world_size_runs_in_one_launch(fleet):
    """Each rank's row says where in its launch it ran: the command's two micro-batch sizes share one
    launch, the three setups given to run_suite another."""
    rows = [r for r in _rows(fleet[0], TrainStepResult) if r.world_size == 2]
    assert [(r.micro_batch, r.rank, r.details["setup_in_launch"]) for r in rows[:4]] == [
        (1, 0, 1), (1, 1, 1), (2, 0, 2), (2, 1, 2)]
    assert [(r.layout["tp"], r.layout["pp"], r.rank, r.details["setup_in_launch"]) for r in rows[4:]] == [
        (2, 1, 0, 1), (2, 1, 1, 1), (1, 2, 0, 2), (1, 2, 1, 2), (1, 2, 0, 3), (1, 2, 1, 3), (1, 2, 0, 4), (1, 2, 1, 4),
        (1, 2, 0, 5), (1, 2, 1, 5), (1, 1, 0, 6), (1, 1, 1, 6)]


def _zbv_peak_bytes(row: TrainStepResult, setup: TrainSetup) -> tuple[int, int]:
    """What the core says a zbv rank's activations take at the moment they peak, and for one micro-batch through
    both its chunks: each chunk's bytes (the ledger split at the chunk boundary) times its micro-batches alive
    then (headroom.core.memory.pipeline.v_peak). Token ids are left out: the step holds them whole, and the
    measurement (headroom.agent.pipeline_stages.SavedLive) ignores them."""
    config = setup.config
    rank = for_rank(estimate(setup.spec, config, "cpu", setup.accumulation_steps), row.rank).rank
    ledger = activation_ledger(setup.spec, config, "cpu", rank=rank)
    split = config.chunk_layers(setup.spec)[rank_chunks(config.layout, row.rank)[0]]
    embedding = len(activation_ledger(setup.spec, config, "cpu", rank=EMBEDDING_ONLY).traced) if rank.first else 0
    down, up = chunk_device_bytes(ledger, split, embedding, ("activation",))
    alive = v_peak(config.layout.pp, row.rank, setup.accumulation_steps,
                   chunk_device_bytes(ledger, split, embedding))
    return alive[0] * down + alive[1] * up, down + up


@pytest.mark.slow
def test_zbv_ranks_keep_what_the_schedules_table_says(fleet):
    """torch's ScheduleZBVZeroBubble on two gloo ranks, 4 chunks of one block over 4 micro-batches: each rank
    holds its chunk and its mirror (rank 0 the embedding and the head), saves what the core predicts byte for
    byte, and at its peak keeps exactly the micro-batches of each chunk the core's walk of the table says."""
    setup = next(s for s in SWEEP if s.config.layout.schedule == "zbv")
    rows = _steps(fleet[0], {"pp": 2, "schedule": "zbv"})
    assert [(r.rank, r.prediction["rank"], r.status) for r in rows] == [(0, "first and last stages", "ok"),
                                                                         (1, "middle stage", "ok")]
    for r in rows:
        assert r.activation_bytes == r.predicted_activation_bytes, r.details["probe"]
        assert r.details["parameter_bytes"] == r.prediction["memory_bytes"]["parameters"]
        assert r.details["gradient_bytes"] == r.prediction["memory_bytes"]["gradients"]
        measured = r.details["in_flight"]
        assert (measured["saved_peak_bytes"], measured["saved_micro_batch_bytes"]) == _zbv_peak_bytes(r, setup)
    assert rows[1].details["in_flight"]["micro_batches_in_flight"] == 2 == _predicted_in_flight(rows[1])
    first = rows[0].details["gradient_shards"]
    assert "down.embed.weight" in first and "up.lm_head.weight" in first
    assert {name.split(".")[2] for name in first if ".blocks." in name} == {"0"}  # one block a chunk


@pytest.mark.slow
def test_three_zbv_ranks_with_chunks_of_the_embedding_or_head_alone(tmp_path):
    """4 layers over 3 ranks of ZB-V: torchtitan's rule gives chunks 0,1,1,1,1,0, so rank 0 holds the embedding
    and the head and no block; 4 micro-batches, fewer than the 2 pp - 1 = 5 torch plans for, so it drops the
    rest. Every rank saves and keeps what the core predicts, byte for byte."""
    setup = TrainSetup(spec=get_preset("bench-llama-small"), steps=2, accumulation_steps=4, config=TrainConfig(
        seq_len=32, micro_batch=1, precision="fp32", layout=Layout(pp=3, schedule="zbv", virtual_stages=2)))
    rows = [case.measure(CPU) for case in train_ranks.cases([setup], "cpu")]
    assert [r.prediction["rank"] for r in rows] == ["first and last stages", "middle stage", "middle stage"]
    for r in rows:
        assert r.status == "ok", r.message
        assert r.activation_bytes == r.predicted_activation_bytes
        assert r.details["parameter_bytes"] == r.prediction["memory_bytes"]["parameters"]
        measured = r.details["in_flight"]
        assert (measured["saved_peak_bytes"], measured["saved_micro_batch_bytes"]) == _zbv_peak_bytes(r, setup)
    assert [r.details["in_flight"]["micro_batches_in_flight"] for r in rows[1:]] == [3, 3]


@pytest.mark.slow
def test_four_stages_hold_what_1f1b_predicts(tmp_path):
    """A 4-layer model over 4 stages, 1F1B with 4 micro-batches: stage i holds 4 - i micro-batches."""
    setup = TrainSetup(spec=get_preset("bench-llama-small"), steps=2, accumulation_steps=4, config=TrainConfig(
        seq_len=32, micro_batch=1, precision="fp32", layout=Layout(pp=4)))
    rows = [case.measure(CPU) for case in train_ranks.cases([setup], "cpu")]
    assert [r.prediction["rank"] for r in rows] == ["first stage", "middle stage", "middle stage", "last stage"]
    for r in rows:
        assert r.status == "ok", r.message
        assert r.activation_bytes == r.predicted_activation_bytes
        assert r.details["parameter_bytes"] == r.prediction["memory_bytes"]["parameters"]
        assert r.details["in_flight"]["micro_batches_in_flight"] == 4 - r.rank


@pytest.mark.slow
def test_tensor_parallel_steps_predict_time_and_communication_from_measured_collectives(fleet):
    for r in _steps(fleet[0], {"tp": 2}):
        assert r.predicted_step_time_s > 0 and r.predicted_communication_s > 0
    with open_store(fleet[0]) as store, store.session() as session:
        profile, calibration = measured_in(session, "latest")
    assert profile.collectives is not None and profile.collectives.group_sizes() == (2,)
    config = TrainConfig(seq_len=64, micro_batch=2, precision="fp32", layout=Layout(tp=2, sp=True))
    terms = step_communication(get_preset(MODEL), config, 1, profile.cluster())
    assert {t.link_key for t in terms} == {MEASURED}
    # Calibration fits the communication term of the multi-rank rows apart: every row whose predicted
    # exposed time is positive. Tensor-parallel traffic and a pipeline's waits are never hidden (4 rows);
    # FSDP's may be, behind compute the profile measured slow (a loaded host).
    with open_store(fleet[0]) as store, store.session() as session:
        device = find_device(session, "latest")
        observations = step_observations(train_step_records(session, device), profile)
    paired = [o for o in observations if o.predicted_communication_s and o.measured_communication_s]
    fit = calibration.communication
    assert fit.samples + fit.noisy + len(fit.outliers) == len(paired) >= 4 and fit.samples
    assert "Communication: measured/predicted x" in calibration.confidence()
    assert 2 in calibration.measured_on.gpus


@pytest.mark.slow
def test_agent_train_prints_each_rank_and_its_communication(fleet):
    out = fleet[2]
    for micro in (1, 2):
        assert f"micro {micro} x1 none flash fp32 dp2 zero3 rank 0" in out
        assert f"micro {micro} x1 none flash fp32 dp2 zero3 rank 1" in out
    assert out.count("exposed communication") == 4


def test_a_step_that_cannot_fit_the_host_is_skipped_not_run(run_cli, tmp_path, monkeypatch):
    """8.03e9 parameters x 20 bytes at the fp32 AdamW step: 16 of static state and foreach's copy of the
    second moments."""
    monkeypatch.setenv("COLUMNS", "1000")  # the summary's content, not its wrapping (tests/test_cli_wrap.py)
    result = run_cli("agent", "train", "--model", "llama3-8b", "--device", "cpu", "--db",
                      f"sqlite:///{tmp_path / 'big.db'}", "--quiet")
    assert result.returncode == 1
    assert "skipped: llama3-8b" in result.stdout and "the core predicts a peak of 160.6 GB" in result.stdout
    assert "measured nothing: 1 skipped" in result.stderr
    (row,) = _rows(f"sqlite:///{tmp_path / 'big.db'}", TrainStepResult)
    assert row.status == "skipped" and row.predicted_peak_bytes > 100e9


@pytest.mark.parametrize(("flags", "message"), [
    (("--nproc", "4", "--tp", "2"), "--nproc 4 but the layout has tp x dp x pp x cp = 2 ranks"),
    (("--cp", "2"), "cp 2 is planned by the core but not measured"),
    (("--dp", "2", "--zero", "3", "--ep", "2"), "ep 2 is planned by the core but not measured"),
    (("--pp", "2", "--schedule", "interleaved"), "not interleaved: use --schedule 1f1b, gpipe or zbv"),
    (("--pp", "2", "--dp", "2"), "the agent runs a pipeline alone"),
    (("--pp", "2"), "--accumulation 1 is fewer than pp 2; use --accumulation 2 or more, or --schedule gpipe"),
    (("--dp", "2", "--zero", "2"), "torch has no ZeRO-2 of its own; measure zero 3 (FSDP2), kept gathered"),
    (("--tp", "2", "--zero", "2"), "torch has no ZeRO-2 of its own"),  # no data parallelism: still not run
    (("--dp", "2", "--zero", "3", "--defer-gradient-sync", "on"), "the agent reduces the gradients every micro-batch"),
    (("--dp", "2", "--overlap-grad-reduce", "off"), "--overlap-grad-reduce off: DDP reduces the gradients beside"),
    (("--tp", "2", "--sp", "on", "--tp-overlap", "on"), "--tp-overlap on: the agent runs tensor parallelism without"),
    (("--tp", "2", "--dp", "2"), "use zero 3"),
    (("--nproc", "0"), "--nproc 0: give 1 or more processes"),
    (("--nproc", "10000000"), "10,000,000 ranks: the agent starts one process per rank on this box, at most 64"),
    (("--dp", "65"), "65 ranks: the agent starts one process per rank on this box, at most 64"),
    (("--steps", "1001"), "--steps must be 1 to 1000 and --accumulation 1 to 4,096, got 1,001 and 1"),
    (("--accumulation", "10000000"), "got 3 and 10,000,000"),
])
def test_layouts_the_agent_cannot_run_are_refused_by_name(capsys, flags, message):
    assert main(["agent", "train", *TRAIN_FLAGS, *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_pipeline_of_a_tied_model_is_refused_by_name(capsys):
    flags = ["--model", "bench-gpt-tiny", *TRAIN_FLAGS[2:], "--pp", "2"]
    assert main(["agent", "train", *flags]) == 2
    assert "tied embeddings" in capsys.readouterr().err


@pytest.mark.parametrize(("model", "tp", "message"), [
    ("bench-gpt-tiny", "2", "tp 2: bench-gpt-tiny has tied embeddings; the agent shards the vocabulary of untied"),
    ("bench-llama-tiny", "3", "tp 3: bench-llama-tiny's 4 query and 2 key/value heads do not split over it"),
])
def test_tensor_parallelism_the_decoder_cannot_take_is_refused_before_launching(capsys, model, tp, message):
    flags = ["--model", model, *TRAIN_FLAGS[2:], "--tp", tp]
    assert main(["agent", "train", *flags]) == 2
    assert message in capsys.readouterr().err


def test_collectives_need_ranks(capsys):
    assert main(["agent", "run", "--only", "collectives", "--device", "cpu"]) == 2
    assert "--only collectives needs 2 or more processes" in capsys.readouterr().err
    assert main(["agent", "run", "--only", "collectives", "--device", "cpu", "--nproc", "1000000000"]) == 2
    assert "--nproc 1,000,000,000: the agent starts one process per rank on this box, at most 64" in \
        capsys.readouterr().err
