"""``headroom agent train --fp8 / --compile on``: the agent runs torchao's float8 linears and torch.compile'd blocks
on one device, and the store keeps each step's recipe in columns of its own (revision 0007), so that a stored step
reads back as the configuration it ran and its prediction is the recipe's."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from headroom.cli.main import main
from headroom.db.models import Fingerprint
from headroom.db.profiles import train_step_records
from headroom.db.store import open_store

FLAGS = ["agent", "train", "--model", "bench-llama-tiny", "--seq-len", "64", "--micro-batch", "2", "--steps", "2",
         "--device", "cpu", "--precision", "bf16-pure", "--quiet"]


def _stored(db) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT status, fp8, compile, activation_bytes, predicted_activation_bytes, "
            "json_extract(prediction, '$.config.fp8'), json_extract(prediction, '$.config.compile') "
            "FROM train_step_results").fetchall()


def _records(db):
    with open_store(f"sqlite:///{db}", mode="read") as store, store.session() as session:
        (device,) = session.query(Fingerprint.device_name).distinct().all()
        return train_step_records(session, device[0])


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "fp8", "compiled"), [
    (["--fp8", "torchao-rowwise"], "torchao-rowwise", False),
    (["--compile", "on"], "off", True),  # inductor builds its CPU kernels: about 15 s
], ids=["float8", "compiled"])
def test_a_step_keeps_its_recipe_and_saves_what_the_recipes_ledger_says(flags, fp8, compiled, tmp_path):
    db = tmp_path / "recipes.db"
    # A process of its own: dynamo's caches and inductor's compile threads stay out of the test worker.
    ran = subprocess.run([sys.executable, "-m", "headroom.cli.main", *FLAGS, *flags, "--db", f"sqlite:///{db}"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert ran.returncode == 0, ran.stderr
    ((status, stored_fp8, stored_compile, saved, predicted, predicted_fp8, predicted_compile),) = _stored(db)
    assert (status, stored_fp8, bool(stored_compile)) == ("ok", fp8, compiled)
    assert (predicted_fp8, bool(predicted_compile)) == (fp8, compiled)  # the prediction is the recipe's
    assert saved == predicted and saved > 0  # what autograd kept, byte for byte (tests/test_float8.py, test_compile.py)
    (record,) = _records(db)
    run = record.run_config
    assert (run.train.fp8, run.train.compile, run.train.precision) == (fp8, compiled, "bf16-pure")
    assert record.label == ("bench-llama-tiny micro 2 x1 none" + (f" fp8 {fp8}" if fp8 != "off" else "")
                            + (" compiled" if compiled else ""))


@pytest.mark.parametrize(("flags", "said"), [
    (["--fp8", "te-delayed"],
     ("--fp8 te-delayed: Transformer Engine's recipes run inside Megatron-LM on CUDA, not in the agent's decoder, "
      "which runs torchao's (torchao-tensorwise, torchao-rowwise, torchao-mxfp8); plan it: headroom plan --stack "
      "megatron --fp8 te-delayed")),
    (["--fp8", "torchao-rowwise", "--nproc", "2"],
     ("--fp8: the agent measures them on one device; drop --nproc and the parallel axes (headroom plan plans them "
      "on any layout)")),
    (["--compile", "on", "--fp8", "torchao-rowwise", "--nproc", "2", "--tp", "2"],
     "--fp8 and --compile on: the agent measures them on one device"),
], ids=["transformer-engine", "float8 on ranks", "both on ranks"])
def test_what_the_agent_cannot_run_is_refused_before_anything_is_stored(flags, said, tmp_path, capsys):
    db = tmp_path / "refused.db"
    assert main([*FLAGS, *flags, "--db", f"sqlite:///{db}"]) == 2
    assert said in capsys.readouterr().err
    assert not db.exists()
