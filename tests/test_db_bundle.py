"""Bundles (db/bundle.py): round trips, idempotent import, and bad bundles that write nothing."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path

import pytest

from headroom.db.bundle import (
    BUNDLE_FORMAT,
    check_runs,
    export_bundle,
    export_file,
    import_bundle,
    merge_stores,
    read_runs,
    write_runs,
)
from headroom.db.errors import BundleError
from headroom.db.store import open_store
from tests.db_support import (  # noqa: F401
    fingerprint,
    fleet,
    postgres_url,
    record_run,
    results,
    row_counts,
    sqlite_url,
)


@pytest.fixture
def source(tmp_path) -> str:
    """A store with three runs on two devices: completed, failed with a result, and still running."""
    url = f"sqlite:///{tmp_path / 'source.db'}"
    with open_store(url, mode="write") as store:
        record_run(store, seed=1)
        record_run(store, seed=2, hostname="gpu-08", device_name="NVIDIA A100-SXM4-80GB")
        running = store.start_run(fingerprint(), suite="quick", benchmark_version="1")
        store.add_result(running, results(seed=3)[1])
    return url


def _export(url: str, path: Path) -> bytes:
    with open_store(url) as store:
        export_file(store, path)
    return path.read_bytes()


@pytest.mark.parametrize("target", ["sqlite_url", "postgres_url"])
def test_export_import_export_gives_identical_bytes(source, target, request, tmp_path):
    first = _export(source, tmp_path / "first.json.gz")
    url = request.getfixturevalue(target)
    with open_store(url, mode="write") as store:
        report = write_runs(store, check_runs(read_runs(tmp_path / "first.json.gz"), "first"), "first")
        assert (len(report.added), len(report.skipped), report.results) == (3, 0, 13)  # two runs of one of each of 6 kinds, one result
    assert _export(url, tmp_path / "second.json.gz") == first
    bundle = json.loads(gzip.decompress(first))
    assert bundle["format"] == BUNDLE_FORMAT and bundle["version"] == 1
    assert [run["status"] for run in bundle["runs"]] == ["completed", "completed", "running"]


def test_importing_twice_adds_nothing_the_second_time(source, sqlite_url, tmp_path, run_cli):
    _export(source, tmp_path / "bundle.json")
    first = run_cli("db", "import", str(tmp_path / "bundle.json"), "--db", sqlite_url)
    assert first.returncode == 0, first.stderr
    assert "added 3 runs (13 results); skipped 0 runs" in first.stdout
    with open_store(sqlite_url) as store:
        counts = row_counts(store)
    second = run_cli("db", "import", str(tmp_path / "bundle.json"), "--db", sqlite_url)
    assert second.returncode == 0, second.stderr
    assert "added 0 runs (0 results); skipped 3 runs already present" in second.stdout
    with open_store(sqlite_url) as store:
        assert row_counts(store) == counts


def test_merge_copies_only_the_runs_the_destination_lacks(source, tmp_path, run_cli):
    destination = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(destination, mode="write") as store:
        record_run(store, seed=9, hostname="gpu-99")
    assert run_cli("db", "merge", source, "--db", destination).returncode == 0
    merged = run_cli("db", "merge", source, "--db", destination)
    assert merged.returncode == 0 and "added 0 runs" in merged.stdout
    with open_store(destination, mode="write") as fleet, open_store(source) as box:
        assert row_counts(fleet)["runs"] == 4
        assert merge_stores(box, fleet).added == ()
    same = run_cli("db", "merge", source, "--db", source)
    assert same.returncode == 2 and "source and destination are the same store" in same.stderr


def test_a_run_shipped_while_running_is_completed_by_a_later_bundle(source, sqlite_url):
    with open_store(source) as box:
        nightly = export_bundle(box)
    with open_store(sqlite_url, mode="write") as fleet:
        import_bundle(fleet, nightly)
    with open_store(source, mode="write") as box:
        running = next(run["uuid"] for run in nightly["runs"] if run["status"] == "running")
        box.add_result(running, results(seed=4)[0])
        box.finish_run(running, "completed")
        next_night = export_bundle(box)
    with open_store(sqlite_url, mode="write") as fleet:
        report = import_bundle(fleet, next_night)
        assert (report.added, report.replaced, len(report.skipped), report.results) == ((), (running,), 2, 2)
        assert "completed 1 runs stored as running" in str(report)
        assert import_bundle(fleet, next_night).replaced == ()  # and only once
        assert export_bundle(fleet) == next_night
        assert row_counts(fleet)["elementwise_results"] == 3  # the replaced copy's results are gone with it


@pytest.mark.parametrize("forgery, message", [
    (lambda run: run["fingerprint"].update(hostname="forged-box", device_name="Forged GPU"),
     "is running in the store on another machine than the bundle's copy"),
    (lambda run: run["results"].update(elementwise=[]), "running in the store with 1 elementwise results, 1 of which"),
    (lambda run: run["results"]["elementwise"][0].update(gb_per_s=9999.0), "1 of which the bundle's copy lacks"),
], ids=["another machine", "a stored result dropped", "a stored result rewritten"])
@pytest.mark.parametrize("target", ["sqlite_url", "postgres_url"])
def test_a_running_run_is_replaced_only_by_a_finished_copy_of_itself(source, target, request, forgery, message):
    """A forged 'finished' copy of a run still in progress must not rewrite what the box measured."""
    url = request.getfixturevalue(target)
    with open_store(source) as box:
        nightly = export_bundle(box)
    with open_store(url, mode="write") as fleet:
        import_bundle(fleet, nightly)
        before = export_bundle(fleet)
    forged = json.loads(json.dumps(nightly))
    running = next(run for run in forged["runs"] if run["status"] == "running")
    running.update(status="completed", finished_at=running["started_at"])
    forgery(running)
    with open_store(url, mode="write") as fleet:
        with pytest.raises(BundleError, match=re.escape(message)):
            import_bundle(fleet, forged)
        assert export_bundle(fleet) == before


# ---- bad bundles write nothing ----------------------------------------------------------


def _refused(run_cli, bundle: Path, fleet: str, message: str) -> None:
    with open_store(fleet) as store:
        before = row_counts(store)
    result = run_cli("db", "import", str(bundle), "--db", fleet)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    with open_store(fleet) as store:
        assert row_counts(store) == before


def test_a_truncated_gzip_bundle_writes_nothing(source, fleet, tmp_path, run_cli):
    data = _export(source, tmp_path / "bundle.json.gz")
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    _refused(run_cli, tmp_path / "cut.json.gz", fleet, "truncated or damaged gzip")


def test_a_truncated_json_bundle_writes_nothing(source, fleet, tmp_path, run_cli):
    data = _export(source, tmp_path / "bundle.json")
    (tmp_path / "cut.json").write_bytes(data[: len(data) * 2 // 3])
    _refused(run_cli, tmp_path / "cut.json", fleet, "not valid JSON at line")


def test_a_truncated_bundle_does_not_even_create_the_store(source, tmp_path, run_cli):
    data = _export(source, tmp_path / "bundle.json.gz")
    (tmp_path / "cut.json.gz").write_bytes(data[:100])
    result = run_cli("db", "import", str(tmp_path / "cut.json.gz"), "--db", str(tmp_path / "new.db"))
    assert result.returncode == 2 and not (tmp_path / "new.db").exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b["runs"][2]["results"]["elementwise"][0].update(gb_per_s="fast"),
         "run 3 ({uuid}): elementwise result 1: field 'gb_per_s' must be a finite number, got 'fast'"),
        (lambda b: b["runs"][1]["fingerprint"].pop("hostname"),
         "run 2 ({uuid}): fingerprint: missing field 'hostname'"),
        (lambda b: b["runs"][1].update(status="done"),
         "run 2 ({uuid}): field 'status' must be one of running, completed, failed, aborted, got 'done'"),
        (lambda b: b["runs"][2]["results"]["matmul"].append({"dtype": "bf16", "m": 1, "n": 1, "k": 1, "cores": 3}),
         "run 3 ({uuid}): matmul result 1: unknown field 'cores'"),
        (lambda b: b["runs"][1].update(started_at="yesterday"),
         "run 2 ({uuid}): field 'started_at' must be an ISO 8601 time"),
        (lambda b: b["runs"][2].update(uuid=b["runs"][0]["uuid"]),
         "run 3: uuid {first} appears twice in the bundle"),
        (lambda b: b.update(version=2), "bundle version 2; this headroom reads version 1 (upgrade headroom"),
        (lambda b: b.update(version=True), "bundle version True; this headroom reads version 1"),
        (lambda b: b.update(format="something-else"), "not a Headroom bundle (format 'something-else'"),
        (lambda b: b["runs"][2]["results"]["elementwise"][0].update(gb_per_s=-3.0),
         "run 3 ({uuid}): elementwise result 1: field 'gb_per_s' must not be negative"),
        (lambda b: b["runs"][1].update(finished_at="2020-01-01T00:00:00+00:00"),
         "run 2 ({uuid}): finished_at 2020-01-01T00:00:00+00:00 is before started_at"),
        (lambda b: b["runs"][1]["fingerprint"].update(hostname="gpu\x00-07"),
         "run 2 ({uuid}): fingerprint: field 'hostname' must not contain a NUL character"),
        (lambda b: b["runs"][1].update(labels={"rack": "b\ud8007"}),
         "run 2 ({uuid}): field 'labels' must not contain a lone surrogate (it is not text)"),
        (lambda b: b["runs"][2]["results"]["elementwise"][0].update(elements=2**70),
         "run 3 ({uuid}): elementwise result 1: field 'elements' must be at most 9,223,372,036,854,775,807 (64 bits)"),
        (lambda b: b["runs"][1]["results"]["train_step"][0]["model_spec"].update(n_layers=10**12),
         "run 2 ({uuid}): train_step result 1: field 'model_spec' is not a model the core accepts: llama2-7b: "
         "n_layers 1,000,000,000,000 is beyond any trainable model"),
    ],
    ids=["bad number", "missing field", "bad status", "unknown field", "bad time", "duplicate run", "newer", "version true", "format",
         "negative rate", "finished before started", "NUL", "lone surrogate", "beyond 64 bits", "poisoned model"],
)
def test_a_malformed_bundle_names_the_problem_and_writes_nothing(source, fleet, tmp_path, run_cli, damage, message):
    with open_store(source) as store:
        bundle = export_bundle(store)
    uuids = [run["uuid"] for run in bundle["runs"]]
    damage(bundle)
    (tmp_path / "bad.json").write_text(json.dumps(bundle))
    index = 2 if "run 3" in message else 1
    _refused(run_cli, tmp_path / "bad.json", fleet, message.format(uuid=uuids[index], first=uuids[0]))


def test_a_decompression_bomb_is_refused_before_it_fills_memory(fleet, tmp_path, run_cli):
    """200 MB of spaces in 0.2 MB of gzip (1000x; exported bundles expand about 6x): refused at 100x, early."""
    import subprocess
    import sys
    import zlib

    deflate, chunk = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS), b" " * 2**20
    with (tmp_path / "bomb.json.gz").open("wb") as f:
        f.write(deflate.compress(b'{"format": "headroom-bundle", "version": 1, "runs": []'))
        for _ in range(200):
            f.write(deflate.compress(chunk))
        f.write(deflate.compress(b"}") + deflate.flush())
    size = (tmp_path / "bomb.json.gz").stat().st_size
    assert size < 300_000
    _refused(run_cli, tmp_path / "bomb.json.gz", fleet, f"expands more than 100x its {size:,} bytes")
    # A fresh interpreter's peak memory (VmHWM: ru_maxrss would carry this process's peak over the exec):
    # decompressing it all would add 200 MB.
    code = ("import sys\nfrom headroom.db.bundle import check_file\nfrom headroom.db.errors import BundleError\n"
            "try:\n    check_file(__import__('pathlib').Path(sys.argv[1]))\nexcept BundleError:\n    pass\n"
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))")
    peak_kib = int(subprocess.run([sys.executable, "-c", code, str(tmp_path / "bomb.json.gz")], capture_output=True,
                                  text=True, check=True, timeout=60).stdout)
    assert peak_kib < 150 * 1024, f"peak {peak_kib / 1024:.0f} MiB: the bomb was not stopped early"


def test_non_finite_numbers_are_refused(fleet, tmp_path, run_cli):
    (tmp_path / "nan.json").write_text('{"format": "headroom-bundle", "version": 1, "runs": [NaN]}')
    _refused(run_cli, tmp_path / "nan.json", fleet, "NaN is not a number a bundle may carry")


def test_a_write_the_store_refuses_midway_rolls_the_whole_import_back(source, fleet, tmp_path):
    """All-or-nothing past validation too: the store itself rejects the last run's first result."""
    with open_store(source) as store:
        bundle = export_bundle(store)
    bundle["runs"][2]["results"]["elementwise"][0]["elements"] = 123_454_321
    with sqlite3.connect(fleet.removeprefix("sqlite:///")) as connection:
        connection.execute("CREATE TRIGGER refuse BEFORE INSERT ON elementwise_results WHEN NEW.elements = 123454321 "
                           "BEGIN SELECT RAISE(ABORT, 'disk quota exceeded'); END")
    connection.close()
    with open_store(fleet, mode="write") as store:
        before = row_counts(store)
        with pytest.raises(BundleError, match=r"the store refused the import \(disk quota exceeded\); nothing imported"):
            import_bundle(store, bundle)
        assert row_counts(store) == before



@pytest.fixture(scope="module")
def stores_of_two_sizes(tmp_path_factory) -> dict[int, Path]:
    """Stores of real H200 results (benchmarks/big_store.py) holding about 2,000 and 8,000 results."""
    from benchmarks.big_store import build_store

    folders = {}
    for results in (2_000, 8_000):
        folders[results] = tmp_path_factory.mktemp(f"store{results}")
        build_store(f"sqlite:///{folders[results] / 'store.db'}", results)
    return folders


@pytest.mark.slow
def test_export_import_and_merge_memory_does_not_grow_with_the_store(stores_of_two_sizes):
    """Four times the results, the same peak: a run is held at a time, never the store or the bundle
    (benchmarks/bench_big_store.py prints the figures at 100,000 results)."""
    from benchmarks.peak_memory import run_headroom

    peaks, sizes = {}, {}
    for results, folder in stores_of_two_sizes.items():
        store, bundle = str(folder / "store.db"), str(folder / "bundle.json")
        commands = {"export": ("db", "export", bundle, "--db", store),
                    "import": ("db", "import", bundle, "--db", str(folder / "imported.db")),
                    "merge": ("db", "merge", store, "--db", str(folder / "merged.db"))}
        for name, args in commands.items():
            done = run_headroom(*args, timeout=120)
            assert done.returncode == 0, done.stderr
            peaks[name, results] = done.peak_mib
        sizes[results] = (folder / "bundle.json").stat().st_size / 2**20
    assert sizes[8_000] - sizes[2_000] > 15  # MiB more JSON: holding it whole would show
    for name in ("export", "import", "merge"):
        assert peaks[name, 8_000] - peaks[name, 2_000] < 4, (name, peaks)
