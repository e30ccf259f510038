"""Bundle files read and written a run at a time (db/bundle_file.py), checked against the json module."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

import headroom.db.bundle_file as bundle_file
from benchmarks.big_store import REFERENCE
from headroom.db.bundle_file import dump_bundle, read_runs
from headroom.db.errors import BundleError

RUNS = json.loads(gzip.decompress(REFERENCE.read_bytes()))["runs"]
"""The H200 reference runs: real documents, with nested JSON, nulls, floats and long sample lists."""


def _bundle(runs: list) -> dict:
    return {"format": "headroom-bundle", "version": 1, "schema_revision": "0005", "runs": runs}


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_bundle_written_a_run_at_a_time_is_json_dumps_byte_for_byte(count):
    out = io.StringIO()
    counts = dump_bundle(iter(RUNS[:count]), out, "0005")
    assert out.getvalue() == json.dumps(_bundle(RUNS[:count]), indent=1) + "\n"
    assert (counts.runs, counts.results) == (count, sum(len(v) for r in RUNS[:count] for v in r["results"].values()))


@pytest.fixture
def small_pieces(monkeypatch):
    """Files read 7 bytes at a time, so every value and token is split across pieces."""
    monkeypatch.setattr(bundle_file, "_CHUNK", 7)


@pytest.mark.parametrize(
    "layout",
    [
        {"indent": 1},
        {"separators": (",", ":")},  # no whitespace at all
        {"sort_keys": True, "indent": "\t"},  # 'runs' before 'schema_revision' and 'version', as jq -S writes it
        {"indent": 1, "ensure_ascii": False},
    ],
    ids=["exported", "compact", "sorted keys", "unicode"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_any_layout_of_a_bundle_reads_as_json_loads_reads_it(tmp_path, small_pieces, layout, packed):
    bundle = _bundle([*RUNS, {**RUNS[0], "labels": {"rack": "é€😀"}}])
    data = json.dumps(bundle, **layout).encode()
    path = tmp_path / "bundle.json"
    path.write_bytes(gzip.compress(data) if packed else data)
    assert list(read_runs(path)) == json.loads(data)["runs"]


def _cut_bundle() -> str:
    """A small bundle with nested documents, several lines and a number at the very end of the header."""
    run = {"uuid": "r", "labels": {"a": [1, 2.5, None, True]}, "results": {"matmul": [{"m": 4096}]}}
    text = json.dumps(_bundle([run, run]), indent=1)
    return text.replace('"version": 1,', '"version": 1 ,').replace('"schema_revision": "0005"', '"schema_revision":"0005"')


def test_every_truncation_is_refused_where_json_loads_finds_it(tmp_path, small_pieces):
    text = _cut_bundle()
    path = tmp_path / "cut.json"
    for end in range(len(text) - 1):  # every proper prefix; the last character closes the object
        path.write_text(text[:end])
        with pytest.raises(json.JSONDecodeError) as expected:
            json.loads(text[:end])
        e = expected.value
        with pytest.raises(BundleError) as refused:
            list(read_runs(path))
        assert str(refused.value) == (f"{path}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                                      "a truncated bundle ends early; nothing imported"), end


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "not a Headroom bundle (the file is a list, a bundle is a JSON object with format 'headroom-bundle')"),
        ('"headroom-bundle"', "not a Headroom bundle (the file is a string"),
        ("-12.5e3", "not a Headroom bundle (the file is a number"),
        ("hello", "not valid JSON at line 1 column 1 (Expecting value)"),
        ('{"format": "other", "runs": []}', "not a Headroom bundle (format 'other', expected 'headroom-bundle')"),
        ('{"runs": [], "version": 1}', "not a Headroom bundle (format None"),
        ('{"format": "headroom-bundle", "version": 2, "runs": [1]}',
         "bundle version 2; this headroom reads version 1 (upgrade headroom to import it)"),
        ('{"format": "headroom-bundle", "version": 1}', "no list 'runs'"),
        ('{"format": "headroom-bundle", "version": 1, "runs": {}}', "'runs' must be a list of run documents"),
        ('{"format": "headroom-bundle", "version": 1, "extra": 0, "runs": []}', "unknown key 'extra'"),
        ('{"format": "headroom-bundle", "format": "headroom-bundle", "version": 1, "runs": []}',
         "key 'format' appears twice in the bundle"),
        ('{"format": "headroom-bundle", "version": 1, "runs": [{"a": NaN}]}', "NaN is not a number a bundle may carry"),
        ('{"format": "headroom-bundle", "version": 1, "runs": []} []', "not valid JSON at line 1 column 57 (Extra data)"),
        ('{"format": "headroom-bundle", "version": 1, "runs": [' + "[" * 100_000 + "]" * 100_000 + "]}",
         "run 1: JSON nested too deeply to be a bundle"),
        (b'{"format": "headroom-bundle", "version": 1, "runs": ["\xff"]}', "not UTF-8 text, so not a bundle"),
    ],
    ids=["list", "string", "number", "not json", "format", "no format", "newer", "no runs", "runs not a list", "unknown key", "twice", "NaN",
         "extra data", "nested", "not utf-8"],
)
def test_what_is_not_a_bundle_is_named(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(BundleError, match="^" + str(path).replace(".", r"\.")) as refused:
        list(read_runs(path))
    assert message in str(refused.value)


@pytest.mark.parametrize("piece", [1 << 20, 64], ids=["read whole", "read in pieces"])
def test_a_run_longer_than_any_bundle_holds_is_refused(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(bundle_file, "MAX_RUN_CHARS", 1000)
    monkeypatch.setattr(bundle_file, "_CHUNK", piece)
    path = tmp_path / "long.json"
    path.write_text(json.dumps(_bundle([{"samples": [0.5] * 197}, {"samples": [0.5] * 200}])))  # 998 and 1,013 characters
    with pytest.raises(BundleError, match="run 2 is longer than 1,000 characters of JSON"):
        list(read_runs(path))


def test_a_missing_file_or_a_directory_is_one_line(tmp_path):
    for path in (tmp_path / "absent.json", tmp_path):
        with pytest.raises(BundleError, match=f"cannot read bundle '{path}': "):
            list(read_runs(Path(path)))


def test_a_name_no_file_can_have_is_one_line():
    with pytest.raises(BundleError, match=r"cannot read bundle 'a\\x00b.json': embedded null byte"):
        list(read_runs(Path("a\x00b.json")))
