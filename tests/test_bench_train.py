"""The training-step benchmark: out-of-memory is data, the sweep goes on."""

import pytest

torch = pytest.importorskip("torch")
from sqlalchemy import select  # noqa: E402

from headroom.agent import bench_train  # noqa: E402
from headroom.agent.runner import run_suite  # noqa: E402
from headroom.agent.suites import TrainSweep  # noqa: E402
from headroom.db.models import Run, TrainStepResult  # noqa: E402
from headroom.db.store import open_store  # noqa: E402


def test_injected_out_of_memory_is_recorded_and_the_sweep_continues(tmp_path, monkeypatch):
    real_build = bench_train.build_model

    def build(setup, device):
        if setup.config.micro_batch == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)")
        return real_build(setup, device)

    monkeypatch.setattr(bench_train, "build_model", build)
    sweep = TrainSweep(model="bench-llama-tiny", seq_len=32, micro_batches=(1, 2, 4), policies=("none", "full"),
                       precision="fp32", steps=2)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url, mode="write") as store:
        cases = [bench_train.case(setup) for setup in sweep.setups()]
        run_suite(store, torch.device("cpu"), "train", quiet=True, cases=cases)
    with open_store(url) as store, store.session() as s:
        rows = s.scalars(select(TrainStepResult).order_by(TrainStepResult.id)).all()
        assert s.scalars(select(Run.status)).one() == "completed"
    assert [(r.micro_batch, r.status) for r in rows] == [(1, "ok"), (1, "ok"), (2, "oom"), (2, "oom"), (4, "ok"), (4, "ok")]
    assert all("out of memory" in r.message for r in rows if r.status == "oom")
    assert all(r.predicted_peak_bytes for r in rows)  # predictions are stored for failed rows too


def test_bf16_master_is_skipped_with_its_reason():
    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.presets import get_preset

    setup = bench_train.TrainSetup(spec=get_preset("bench-llama-tiny"), config=TrainConfig(seq_len=16, precision="bf16-master"))
    row = bench_train.measure(torch.device("cpu"), setup)
    assert row.status == "skipped" and "master-copy optimizer" in row.message
