"""What a store can be (db/migrate.py): current, older, newer, foreign, damaged, not SQLite at all.

A writer upgrades an older store and keeps every row; a reader never
migrates and names the upgrade command; everything else is refused with a
one-line error, exit status 2, and the file left byte for byte as it was.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from datetime import timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, create_engine, select, text

from headroom.db.errors import OutdatedStoreError, StoreError
from headroom.db.migrate import VERSION_TABLE, alembic_config, head, revisions
from headroom.db.models import Base, Fingerprint, TrainStepResult
from headroom.db.store import open_store
from headroom.db.validate import record_values
from tests.db_support import (  # noqa: F401
    file_state,
    postgres_url,
    record_run,
    row_counts,
    sqlite_integrity,
    sqlite_url,
)

FIXTURE = Path(__file__).parent / "fixtures" / "db" / "store-0001.db"
# train step id -> (peak, saved activation bytes, time) after the upgrade. Step 1's document has no log-probs'
# bytes, so the saved bytes 0002 back-filled wrongly cannot be rebuilt (0005): NULL, not a wrong number.
PREDICTED = {1: (71_234_567_890, None, 1.874), 2: (None, None, None)}


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """A copy of the fixture store made at revision 0001."""
    path = tmp_path / "store-0001.db"
    shutil.copyfile(FIXTURE, path)
    return path


def _rows(path: Path) -> dict[str, list[dict]]:
    """Every row of every table, read with the standard library (no Headroom code in the way)."""
    with sqlite3.connect(path) as connection:
        connection.row_factory = sqlite3.Row
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [dict(r) for r in connection.execute(f"SELECT * FROM {t} ORDER BY 1")] for t in tables}


def test_revisions_are_linear_and_the_fixture_is_at_the_previous_one(old_store):
    assert revisions() == ("0001", "0002", "0003", "0004", "0005", "0006", "0007")
    # Read from the scripts' names; Alembic's own walk of the chain agrees.
    walked = ScriptDirectory.from_config(alembic_config()).walk_revisions()
    assert tuple(reversed([script.revision for script in walked])) == revisions()
    assert _rows(old_store)[VERSION_TABLE] == [{"version_num": "0001"}]


@pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
def test_migrations_build_exactly_the_models(backend, request):
    url = request.getfixturevalue(backend)
    open_store(url, mode="write").close()
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True, "version_table": VERSION_TABLE})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_a_writer_upgrades_the_0001_fixture_and_keeps_every_row(old_store):
    before = _rows(old_store)
    with open_store(str(old_store), mode="write") as store:
        assert store.upgraded_from == "0001"
    after = _rows(old_store)
    assert after[VERSION_TABLE] == [{"version_num": head()}]
    for table, rows in before.items():
        if table != VERSION_TABLE:
            assert [{k: row[k] for k in old} for row, old in zip(after[table], rows)] == rows, table
            assert len(after[table]) == len(rows)
    for row in after["train_step_results"]:  # 0002 backfilled its columns from the stored prediction, 0005 repaired
        predicted = (row["predicted_peak_bytes"], row["predicted_activation_bytes"], row["predicted_step_time_s"])
        assert predicted == PREDICTED[row["id"]]
        # 0004: a step stored before multi-rank steps existed ran on one device
        assert (row["rank"], row["world_size"], row["layout"], row["communication_median_s"]) == (0, 1, None, None)
        assert (row["fp8"], row["compile"]) == ("off", 0)  # 0007: a step stored before them ran neither
    assert sqlite_integrity(old_store) == ["ok"]


SAVED_CASES = [  # (precision, recompute): what the agent's smoke and quick suites run
    ("fp32", "none"), ("amp-bf16", "full"), ("amp-bf16", "selective"), ("bf16-master", "every-2"),
    ("fp32", "offload"),  # the host share holds save_on_cpu's parameter copies too: not rebuildable
]


def _agent_prediction(precision: str, recompute: str):
    from headroom.core.memory.estimate import estimate
    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.presets import get_preset
    from headroom.core.specs.recompute import parse_policy

    spec = get_preset("bench-llama-small")
    config = TrainConfig(seq_len=128, micro_batch=2, precision=precision, recompute=parse_policy(recompute))
    return spec, estimate(spec, config, "cuda")  # what agent/bench_train.py stores on a GPU box: document, ledger


def test_0005_repairs_what_0002_backfilled_to_what_the_agent_writes(old_store):
    """Steps stored at 0001 with the agent's real prediction documents: 0002 back-filled the device activations
    without log-probs and host bytes; after 0005 each holds the ledger's saved bytes, as the agent writes today."""
    import json

    with sqlite3.connect(old_store) as connection:
        for i, (precision, recompute) in enumerate(SAVED_CASES):
            spec, predicted = _agent_prediction(precision, recompute)
            connection.execute(
                "INSERT INTO train_step_results (id, run_id, status, recorded_at, model_name, model_spec, seq_len, "
                "micro_batch, accumulation_steps, recompute, attention, precision, optimizer, samples_s, median_s, "
                "prediction) VALUES (?, 1, 'ok', '2025-01-30 10:10:00.000000', ?, ?, 128, 2, 1, ?, 'flash', ?, "
                "'adamw', '[0.1]', 0.1, ?)",
                (10 + i, spec.name, json.dumps({"n_layers": spec.n_layers}), recompute, precision,
                 json.dumps(predicted.to_dict())))
    connection.close()
    engine = create_engine(f"sqlite:///{old_store}")
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0004")
    backfilled = {r["id"]: r["predicted_activation_bytes"] for r in _rows(old_store)["train_step_results"]}
    # A step the agent wrote at 0004 (the offload case's configuration, whose saved bytes the agent knows).
    _, offload = _agent_prediction("fp32", "offload")
    with sqlite3.connect(old_store) as connection:
        columns = [r[1] for r in connection.execute("PRAGMA table_info(train_step_results)") if r[1] != "id"]
        connection.execute(f"INSERT INTO train_step_results (id, {', '.join(columns)}) SELECT 99, "
                           f"{', '.join(columns)} FROM train_step_results WHERE id = {10 + len(SAVED_CASES) - 1}")
        connection.execute("UPDATE train_step_results SET predicted_activation_bytes = ? WHERE id = 99",
                           (offload.ledger.saved_bytes,))
    connection.close()
    with open_store(str(old_store), mode="write") as store:
        assert store.upgraded_from == "0004"
    engine.dispose()
    repaired = {r["id"]: r["predicted_activation_bytes"] for r in _rows(old_store)["train_step_results"]}
    for i, (precision, recompute) in enumerate(SAVED_CASES):
        _, predicted = _agent_prediction(precision, recompute)
        assert backfilled[10 + i] == predicted.activation_bytes  # 0002's quantity: device, no log-probs
        if recompute == "offload":
            assert predicted.ledger.host_bytes > 0 and repaired[10 + i] is None
        else:
            assert predicted.ledger.saved_bytes != predicted.activation_bytes  # the repair changes something
            assert repaired[10 + i] == predicted.ledger.saved_bytes, (precision, recompute)
    assert repaired[99] == offload.ledger.saved_bytes  # the agent's own value is left alone


def test_the_upgraded_store_reads_and_writes_on(old_store):
    with open_store(str(old_store), mode="write") as store:
        with store.session() as session:
            h100 = session.scalars(select(Fingerprint).where(Fingerprint.id == 1)).one()
            step = session.scalars(select(TrainStepResult).where(TrainStepResult.id == 1)).one()
        assert step.recorded_at.tzinfo == timezone.utc and step.prediction["flops"]["step"] == 225 * 10**12
        before = row_counts(store)
        store.start_run(Fingerprint(**record_values(h100)), suite="standard", benchmark_version="2")
        after = row_counts(store)
        assert after["runs"] == before["runs"] + 1
        assert after["fingerprints"] == before["fingerprints"]  # the same box: the digest carried over


def test_a_reader_never_migrates_and_names_the_upgrade_command(old_store, run_cli):
    before = file_state(old_store)
    with pytest.raises(OutdatedStoreError) as refused:
        open_store(str(old_store))
    assert refused.value.upgrade_command == f"headroom db upgrade --db 'sqlite:///{old_store}'"
    info = run_cli("db", "info", "--db", str(old_store))
    assert info.returncode == 2
    assert f"at schema revision 0001, this headroom reads {head()}" in info.stderr
    assert refused.value.upgrade_command in info.stderr
    assert file_state(old_store) == before

    upgrade = run_cli("db", "upgrade", "--db", str(old_store))
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"from schema revision 0001 to {head()}" in upgrade.stdout
    info = run_cli("db", "info", "--db", str(old_store))
    assert info.returncode == 0, info.stderr
    assert "1 incomplete runs" in info.stdout and "00000000-0000-4000-8000-000000000003" in info.stdout


def test_postgres_upgrade_from_0001_keeps_every_row(old_store, postgres_url):
    """The fixture's rows, copied into a PostgreSQL database at 0001, survive the upgrade there too."""
    target = create_engine(postgres_url)
    with target.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
    source, old, new = create_engine(f"sqlite:///{old_store}"), MetaData(), MetaData()
    old.reflect(source)
    new.reflect(target)
    with source.connect() as reading, target.begin() as writing:
        for table in old.sorted_tables:
            if table.name == VERSION_TABLE:
                continue
            rows = [{k: v.replace(tzinfo=timezone.utc) if k.endswith("_at") and v else v for k, v in r._mapping.items()}
                    for r in reading.execute(select(table))]
            for row in rows:
                writing.execute(new.tables[table.name].insert().values(row))
            writing.execute(text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), {len(rows)})"))
    target.dispose()
    source.dispose()

    with open_store(postgres_url, mode="write") as store:
        assert store.upgraded_from == "0001"
        assert row_counts(store) == {"fingerprints": 2, "runs": 3, "matmul_results": 2, "elementwise_results": 1,
                                     "attention_results": 2, "train_step_results": 2, "collective_results": 0,
                                     "dispatch_results": 0}
        with store.session() as session:
            steps = session.scalars(select(TrainStepResult).order_by(TrainStepResult.id)).all()
        assert {s.id: (s.predicted_peak_bytes, s.predicted_activation_bytes, s.predicted_step_time_s)
                for s in steps} == PREDICTED
        record_run(store)
        assert row_counts(store)["runs"] == 4


# ---- refused, untouched ----------------------------------------------------------------


def _refused_everywhere(path: Path, run_cli, message: str) -> None:
    """Reader, writer and CLI actions all refuse ``path``, saying ``message`` on one line; nothing changes."""
    bundle = path.parent / "empty-bundle.json"
    bundle.write_text('{"format": "headroom-bundle", "version": 1, "runs": []}')
    before = file_state(path)
    for mode in ("read", "write"):
        with pytest.raises(StoreError, match=re.escape(message)):
            open_store(str(path), mode=mode)
    for args in (("db", "info"), ("db", "upgrade"), ("db", "import", str(bundle))):
        result = run_cli(*args, "--db", str(path))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert file_state(path) == before


def test_a_store_newer_than_the_code_is_refused(sqlite_url, run_cli):
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with open_store(sqlite_url, mode="write") as store:
        record_run(store)
    with sqlite3.connect(path) as connection:
        connection.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0099'")
    connection.close()
    _refused_everywhere(path, run_cli, "is at schema revision '0099', newer than this headroom knows")


def test_a_file_that_is_not_sqlite_is_refused(tmp_path, run_cli):
    path = tmp_path / "results.db"
    path.write_bytes(b"PK\x03\x04 this is a zip archive, not a database" * 20)
    _refused_everywhere(path, run_cli, "is not a SQLite database (it starts with b'PK\\x03\\x04")


@pytest.mark.parametrize("damage", ["garbage after the header", "truncated"])
def test_a_damaged_sqlite_file_is_refused(tmp_path, run_cli, damage):
    path = tmp_path / "results.db"
    data = FIXTURE.read_bytes()
    path.write_bytes(data[:16] + bytes(range(256)) * 64 if damage == "garbage after the header" else data[:8192])
    reason = "file is not a database" if damage == "garbage after the header" else "database disk image is malformed"
    _refused_everywhere(path, run_cli, f"{reason}; it is not a readable Headroom store")


def test_another_applications_sqlite_database_is_refused(tmp_path, run_cli):
    path = tmp_path / "results.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("CREATE TABLE alembic_version (version_num TEXT)")  # that app's own Alembic
        connection.execute("INSERT INTO users (name) VALUES ('ada')")
    connection.close()
    _refused_everywhere(path, run_cli, "is not a Headroom result store: it holds other tables (alembic_version, users)")


def test_another_applications_postgres_database_is_refused(postgres_url):
    engine = create_engine(postgres_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (id serial PRIMARY KEY, total numeric)"))
    for mode in ("read", "write"):
        with pytest.raises(StoreError, match=r"is not a Headroom result store: it holds other tables \(invoices\)"):
            open_store(postgres_url, mode=mode)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).all() == [
            ("invoices",)
        ]
    engine.dispose()
