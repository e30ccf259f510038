"""Input that once reached the user as an internal error ("please report it", exit 1) is an input error: exit 2,
one line naming the field, nothing stored changed. A time the store cannot hold in UTC (year 1 east of
Greenwich, year 9999 west of it) passed the bundle check and failed in the insert on both back ends; a 400-digit
integer in a float field failed in the check itself; a store URL whose port is not a number failed in
SQLAlchemy's parser."""

from __future__ import annotations

import json

import pytest

from headroom.cli.main import main
from headroom.db.errors import StoreError
from headroom.db.store import open_store
from tests.db_support import postgres_url, record_run, row_counts, sqlite_url, store_url  # noqa: F401


def test_a_store_url_that_does_not_parse_is_refused_without_its_password(capsys):
    with pytest.raises(StoreError, match=r"^cannot read 'postgresql\+psycopg://u:\*\*\*@\[::1' as a store URL; use "):
        open_store("postgresql+psycopg://u:secret@[::1")
    assert main(["db", "info", "--db", "postgresql://u:secret@[::1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headroom: error: cannot read ") and "secret" not in err and err.count("\n") == 1


@pytest.fixture
def bundle(tmp_path, capsys) -> dict:
    """A bundle of one run with one result of each kind, as `db export` writes it."""
    source = f"sqlite:///{tmp_path / 'source.db'}"
    record_run(open_store(source, mode="write"))
    assert main(["db", "export", str(tmp_path / "one.json"), "--db", source]) == 0
    capsys.readouterr()
    return json.loads((tmp_path / "one.json").read_text())


def _set_run(bundle: dict, key: str, value) -> dict:
    bundle["runs"][0][key] = value
    return bundle


def _set_matmul(bundle: dict, key: str, value) -> dict:
    bundle["runs"][0]["results"]["matmul"][0][key] = value
    return bundle


@pytest.mark.parametrize(("change", "field", "problem"), [
    (lambda b: _set_run(b, "started_at", "0001-01-01T00:30:00+05:00"), "started_at",
     "must fall between years 1 and 9999 in UTC"),
    (lambda b: _set_run(b, "finished_at", "9999-12-31T23:00:00-05:00"), "finished_at",
     "must fall between years 1 and 9999 in UTC"),
    (lambda b: _set_matmul(b, "median_s", 10**400), "median_s", "must be a finite number"),
    (lambda b: _set_matmul(b, "m", 10**1000), "m", "must be at most 9,223,372,036,854,775,807 (64 bits)"),
], ids=["year 0 in UTC", "year 10000 in UTC", "400 digits as a float", "1,001 digits as an integer"])
def test_a_bundle_value_the_store_cannot_hold_is_refused_by_name(store_url, bundle, tmp_path, capsys, change, field,
                                                                 problem):
    destination = open_store(store_url, mode="write")
    record_run(destination, seed=1)
    before = row_counts(destination)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(change(bundle)))
    assert main(["db", "import", str(path), "--db", store_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field {field!r} {problem}, got " in err, err[:300]
    assert row_counts(destination) == before


@pytest.mark.parametrize(("change", "message"), [
    (lambda b: _set_matmul(b, "m", 0), "field 'm' must be at least 1, got 0"),
    (lambda b: _set_matmul(b, "min_s", 1.0),
     "timing statistics out of order (min_s 1, median_s 0.00102, max_s 0.00104); min <= median <= max"),
], ids=["a matmul of m 0", "min above the median"])
def test_a_bundle_measurement_that_cannot_have_been_made_is_refused(sqlite_url, bundle, tmp_path, capsys, change,
                                                                    message):
    destination = open_store(sqlite_url, mode="write")
    before = row_counts(destination)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(change(bundle)))
    assert main(["db", "import", str(path), "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(f": matmul result 1: {message}\n"), err[:300]
    assert row_counts(destination) == before


def test_an_integer_of_more_digits_than_python_reads_is_refused_by_place(sqlite_url, bundle, tmp_path, capsys):
    """JSON's integers have no size; Python converts at most 4,300 digits of one."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_set_matmul(bundle, "m", "HUGE")).replace('"HUGE"', "9" * 5000))
    assert main(["db", "import", str(path), "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert err == (f"headroom: error: {path}: run 1: an integer of more than 4,300 digits, which no field holds; "
                   "nothing imported\n")
