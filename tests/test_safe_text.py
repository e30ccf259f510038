"""Stored text that cannot break a store or spoof a screen (headroom.core.safe_text): one limit per text field on both
back ends, names on one line without control or bidirectional formatting characters, and output that shows
what a stored name holds rather than obeying it."""

from __future__ import annotations

import re
import sqlite3

import pytest

from headroom.core.errors import ConfigError
from headroom.core.safe_text import (
    MESSAGE_LIMIT,
    NAME_LIMIT,
    printable,
    printable_lines,
    text_problem,
)
from headroom.dashboard.text import plain
from headroom.db.errors import StoreError
from headroom.db.store import open_store
from tests.db_support import (  # noqa: F401
    fingerprint,
    postgres_url,
    record_run,
    row_counts,
    sqlite_url,
    store_url,
)

SPOOF = "NVIDIA H100 80GB HBM3\nNVIDIA FAKE 1 9 \x1b[31mred\x07 \u202eevil\r"


def test_printable_escapes_what_moves_or_recolours_a_terminal_and_keeps_the_rest():
    assert printable(SPOOF) == "NVIDIA H100 80GB HBM3\\nNVIDIA FAKE 1 9 \\x1b[31mred\\x07 \\u202eevil\\r"
    assert printable("Grafikkarte für München \u00b5s \U0001f680\ttab") == "Grafikkarte für München \u00b5s \U0001f680\\ttab"
    assert printable("a\ud800") == "a\\ud800"
    assert printable("\x85\u061c\u200e\u200f\u202a\u2066\u2069\x7f") == "\\x85\\u061c\\u200e\\u200f\\u202a\\u2066\\u2069\\x7f"
    assert printable_lines(["a", "b\nc", ""]) == "a\nb\\nc\n"


def test_a_name_is_one_line_of_at_most_the_limit_and_a_message_may_break_lines():
    assert text_problem("x" * NAME_LIMIT) is None
    assert text_problem("x" * (NAME_LIMIT + 1)) == f"must be at most {NAME_LIMIT} characters (it has {NAME_LIMIT + 1})"
    assert text_problem("a\nb") == "must not contain a line break, a control or a bidirectional formatting character"
    assert text_problem("a\u202eb") == text_problem("a\nb")
    assert text_problem("a\x00b") == "must not contain a NUL character"
    assert text_problem("a\ud800") == "must not contain a lone surrogate (it is not text)"
    assert text_problem("CUDA out of memory.\n\tTried to allocate 2.00 GiB", message=True) is None
    assert text_problem("x" * MESSAGE_LIMIT, message=True) is None
    assert text_problem("x" * (MESSAGE_LIMIT + 1), message=True) == "must be at most 4,096 characters (it has 4,097)"
    assert text_problem("\x1b[31mred", message=True) == ("must not contain a control or a bidirectional formatting "
                                                       "character")


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("device_name", "X" * 1_000_000, "must be at most 256 characters (it has 1,000,000)"),
    ("device_name", SPOOF, "must not contain a line break, a control or a bidirectional formatting character"),
    ("hostname", "gpu\u202e07", "must not contain a line break, a control or a bidirectional formatting character"),
    ("torch_version", "2" * 300, "must be at most 256 characters (it has 300)"),
], ids=["million-character name", "spoofing name", "bidi host", "long indexed version"])
def test_both_back_ends_refuse_the_same_text_and_keep_what_they_hold(store_url, field, value, problem):
    """PostgreSQL once refused a long device name with an index error (SQLite took it): now both refuse it at
    the check, with the same message, before anything is written."""
    store = open_store(store_url, mode="write")
    record_run(store)
    before = row_counts(store)
    with pytest.raises(StoreError, match=rf"^fingerprint: field '{field}' {re.escape(problem)}, got "):
        record_run(store, seed=1, **{field: value})
    assert row_counts(store) == before


def test_labels_are_names_and_a_run_carries_at_most_64(sqlite_url):
    store = open_store(sqlite_url, mode="write")
    with pytest.raises(StoreError, match=r"field 'labels' must not contain a line break, a control or a "
                                         r"bidirectional formatting character in label 'rack'"):
        with store.recording(fingerprint(), suite="standard", benchmark_version="1", labels={"rack": "b7\u202e"}):
            pass
    with pytest.raises(StoreError, match=r"field 'labels' must hold at most 64 labels \(it has 65\)"):
        with store.recording(fingerprint(), suite="standard", benchmark_version="1",
                             labels={f"k{i}": "v" for i in range(65)}):
            pass
    assert row_counts(store)["runs"] == 0


def _spoofed_store(tmp_path) -> str:
    """A store written before names were checked: its device name holds a line break, ESC, BEL and U+202E."""
    path = tmp_path / "old.db"
    record_run(open_store(f"sqlite:///{path}", mode="write"))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE fingerprints SET device_name = ?", (SPOOF,))
    return f"sqlite:///{path}"


def test_db_info_and_plan_show_a_stored_name_as_the_characters_it_holds(tmp_path, headroom):
    url = _spoofed_store(tmp_path)
    info = headroom("db", "info", "--db", url)
    assert info.returncode == 0, info.stderr
    (row,) = [line for line in info.stdout.splitlines() if "NVIDIA" in line]
    assert row.startswith("NVIDIA H100 80GB HBM3\\nNVIDIA FAKE 1 9 \\x1b[31mred\\x07 \\u202eevil\\rgpu-07 ")
    plan = headroom("plan", "--model", "llama3.2-1b", "--global-batch", "8", "--db", url, "--hardware", "NVIDIA H100")
    assert plan.returncode == 0, plan.stderr
    assert "hardware: NVIDIA H100 80GB HBM3\\nNVIDIA FAKE 1 9 \\x1b[31mred\\x07 \\u202eevil\\r (measured)" in plan.stdout
    for text in (info.stdout, plan.stdout, plan.stderr):
        assert not {"\x1b", "\x07", "\r", "\u202e"} & set(text)
    missing = headroom("plan", "--model", "llama3.2-1b", "--global-batch", "8", "--db", url, "--hardware", "nope")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "NVIDIA H100 80GB HBM3\\nNVIDIA FAKE 1 9 \\x1b[31mred\\x07 \\u202eevil\\r" in missing.stderr


def test_an_error_quoting_a_huge_value_is_one_bounded_line(capsys, monkeypatch):
    from headroom.cli import main as cli_main

    message = f"hidden must be a positive integer, got {'9' * 1_000_000!r}\n\x1b[2J"

    def refuse(args):
        raise ConfigError(message)

    def fail(args):
        raise RuntimeError(message)

    monkeypatch.setattr(cli_main, "build_parser", _parser_calling(refuse))
    assert cli_main.main([]) == 2
    assert capsys.readouterr().err == f"headroom: error: {message[:1000]}... ({len(message):,} characters)\n"
    monkeypatch.setattr(cli_main, "build_parser", _parser_calling(fail))
    assert cli_main.main([]) == 1
    shown = printable(message)
    assert capsys.readouterr().err == (f"headroom: internal error: RuntimeError: {shown[:cli_main.ERROR_LIMIT]}... "
                                       f"({len(shown):,} characters); please report it (rerun with HEADROOM_DEBUG=1 "
                                       "for the traceback)\n")


def _parser_calling(handler):
    import argparse

    def build() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        parser.set_defaults(handler=handler)
        return parser

    return build


def test_a_page_shows_a_bidi_override_instead_of_obeying_it():
    assert plain("run \u202eb7 \x1b[31m") == "run \\\\u202eb7 \\\\x1b\\[31m"


def test_a_merge_from_a_store_holding_an_old_overlong_name_is_refused_by_field(tmp_path, postgres_url, capsys):
    """SQLite took a 1,000,000-character device name before names were checked; PostgreSQL's index refused it,
    failing `db merge` whole with a driver error. Now the merge's check names the field, and writes nothing."""
    from headroom.cli.main import main

    source = tmp_path / "old.db"
    record_run(open_store(f"sqlite:///{source}", mode="write"))
    with sqlite3.connect(source) as connection:
        connection.execute("UPDATE fingerprints SET device_name = ?", ("X" * 1_000_000,))
    destination = open_store(postgres_url, mode="write")
    record_run(destination, seed=1)
    before = row_counts(destination)
    assert main(["db", "merge", f"sqlite:///{source}", "--db", postgres_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'device_name' must be at most 256 characters (it has 1,000,000)" in err
    assert row_counts(destination) == before
