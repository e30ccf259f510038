"""Text output wrapped to the terminal (headroom.cli.wrap): every line within the width but the table rows,
nothing lost, the JSON and the exports untouched.

The CLI runs in this process (conftest's run_cli) with ``$COLUMNS`` set; a search is pure, so each plan is
searched once and its text printed at every width. The default width of a pipe and the cap of a wide terminal
run in a process of their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from headroom.cli import wrap as wrapping
from headroom.cli.wrap import MAX_COLUMNS, MIN_COLUMNS, PIPE_COLUMNS, columns, wrap

ESTIMATE = ("estimate", "--model", "llama3-8b")
FITS = ("plan", "--model", "llama3.2-1b", "--seq-len", "2048", "--global-batch", "32")
SEARCH = ("plan", "--model", "llama3-70b", "--seq-len", "8192", "--global-batch", "512", "--gpus", "64")
NOTHING_FITS = ("plan", "--model", "llama3-70b", "--seq-len", "8192", "--global-batch", "8")
COMMANDS = {"estimate llama3-8b": ESTIMATE, "plan llama3.2-1b": FITS, "plan llama3-70b --gpus 64": SEARCH,
            "plan llama3-70b, nothing fits": NOTHING_FITS}

_PLANS: dict[str, object] = {}


@pytest.fixture
def cli(run_cli, monkeypatch):
    """run_cli at ``$COLUMNS`` ``columns`` (None: unset), each distinct plan searched once for the module (the
    64-GPU search takes seconds; its text is what is under test)."""
    from headroom.cli import plan as plan_cli

    search = plan_cli.plan_and_advise

    def once(request, profile, calibration, progress=None, prune=True):
        key = repr((request, profile, calibration, prune))
        if key not in _PLANS:
            _PLANS[key] = search(request, profile, calibration, progress=progress, prune=prune)
        return _PLANS[key]

    monkeypatch.setattr(plan_cli, "plan_and_advise", once)

    def run(args: tuple[str, ...], columns: int | None) -> subprocess.CompletedProcess[str]:
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", str(columns))
        result = run_cli(*args)
        assert result.returncode == (3 if args[:len(NOTHING_FITS)] == NOTHING_FITS else 0), result.stderr
        return result

    return run


def candidate_table(text: str) -> list[str]:
    """The plan's table of candidates: its header and a row per candidate, columns aligned (never wrapped)."""
    lines = text.splitlines()
    if not any(line.startswith("  #  micro accum") for line in lines):
        return []
    start = next(i for i, line in enumerate(lines) if line.startswith("  #  micro accum"))
    end = lines.index("", start)
    # a rank, or 1= for the candidates tied with the fastest (cli/plan.py)
    assert all(re.match(r" +(\d+|1=) +\d+ +\d+  \S+ +[\d,]+ +[\d.]+", row) for row in lines[start + 1:end]), \
        lines[start:end]
    return lines[start:end]


def collapsed(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("width", [60, 80, 120])
def test_every_line_is_within_the_width_but_the_candidate_table(cli, name, width):
    """The one exception, asserted whole: the rows of the plan's candidate table (75 columns, and 108 with the
    layout column of a search), which keep their columns in line whatever the width."""
    args = COMMANDS[name]
    text = cli(args, width).stdout
    over = [line for line in text.splitlines() if len(line) > width]
    assert over == [row for row in candidate_table(text) if len(row) > width], over
    unwrapped = cli(args, 100_000).stdout
    assert len(text.splitlines()) > len(unwrapped.splitlines())  # some line was wrapped
    assert collapsed(text) == collapsed(unwrapped)  # and nothing lost, moved or added
    assert candidate_table(text) == candidate_table(unwrapped)


def test_columns_past_every_line_is_the_text_as_rendered(cli, monkeypatch):
    """``$COLUMNS`` is taken as given: at 100,000 a plan is the renderer's text unchanged, its hardware line
    one line of hundreds of characters (the comparison the tests above make is with the unwrapped text)."""
    from headroom.cli import plan as plan_cli

    text = cli(FITS, 100_000).stdout
    assert max(len(line) for line in text.splitlines()) > 300
    monkeypatch.setattr(plan_cli, "wrap", lambda text: text)
    assert cli(FITS, 60).stdout == text


def test_the_continuation_of_a_line_hangs_under_its_own_indent(cli):
    lines = cli(SEARCH, 80).stdout.splitlines()
    hardware = lines.index(next(line for line in lines if line.startswith("hardware: ")))
    assert lines[hardware + 1].startswith("    ") and not lines[hardware + 1].startswith("     ")
    why = next(i for i, line in enumerate(lines) if line.startswith("  faster but rejected: "))
    assert lines[why + 1].startswith("      ") and not lines[why + 1].startswith("       ")
    layouts = lines.index(next(line for line in lines if line.startswith("layouts: ")))
    # a layout and why it lost: at 80 columns its text starts under the layout, 4 in
    assert lines[layouts + 1] == "  tp 1, pp 1, cp 1, dp 64, zero 3                      recommended"
    assert lines[layouts + 2].startswith("  tp 1, ") and lines[layouts + 2].endswith("zero 3")
    assert lines[layouts + 3].startswith("      as fast within 1%")


@pytest.mark.parametrize("args", [ESTIMATE, (*ESTIMATE, "--hardware", "h100-sxm", "--ledger"), FITS, SEARCH,
                                  NOTHING_FITS], ids=["estimate", "estimate-time-ledger", "plan", "search",
                                                      "nothing-fits"])
def test_json_is_the_same_at_every_width(cli, args):
    plain = cli((*args, "--json"), None).stdout
    json.loads(plain)
    assert all(cli((*args, "--json"), width).stdout == plain for width in (60, 80, 120))


@pytest.mark.parametrize("format", ["hf", "megatron", "torchtitan"])
def test_an_export_is_the_same_at_every_width(cli, format):
    # on the hf stack the 70B keeps every micro-batch's unsharded gradients (accelerate's no_sync) and fits nowhere
    args = (*SEARCH, "--export", format, *(("--stack", "reference") if format == "hf" else ()))
    plain = cli(args, None).stdout
    assert max(len(line) for line in plain.splitlines()) > 100  # a line that wrapping would have touched
    assert all(cli(args, width).stdout == plain for width in (60, 80))


def test_a_pipe_without_columns_is_wrapped_at_100(headroom, cli):
    """Not a terminal and no ``$COLUMNS`` (the headroom fixture passes none on): PIPE_COLUMNS, the same text as
    ``COLUMNS=100``."""
    result = headroom(*ESTIMATE)
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= PIPE_COLUMNS == 100
    assert result.stdout == cli(ESTIMATE, 100).stdout


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_terminal_wider_than_the_cap_gets_lines_of_100(tmp_path, cli):
    """On a terminal of 200 columns, without ``$COLUMNS``: wrapped at MAX_COLUMNS (100), not at 200."""
    import fcntl
    import select
    import struct
    import termios

    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("HEADROOM_DB", "COLUMNS")}
    env["XDG_DATA_HOME"] = str(tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "headroom.cli.main", *ESTIMATE], stdin=subprocess.DEVNULL,
                               stdout=terminal, stderr=subprocess.PIPE, env=env)
    os.close(terminal)
    chunks = []
    try:
        while select.select([main], [], [], 120)[0]:  # the whole text comes in well under a second
            chunk = os.read(main, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:  # EIO: the terminal's other end closed, everything read
        pass
    finally:
        os.close(main)
    assert process.wait(timeout=120) == 0, process.stderr.read()
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert text == cli(ESTIMATE, MAX_COLUMNS).stdout
    assert max(len(line) for line in text.splitlines()) <= MAX_COLUMNS < len(cli(ESTIMATE, 200).stdout.split("\n")[1])


@pytest.mark.parametrize(("env", "terminal", "expected"), [
    ("120", None, 120), ("1000", 80, 1000), ("40", None, MIN_COLUMNS),  # $COLUMNS as given, floored
    (None, 200, MAX_COLUMNS), (None, 80, 80), (None, 40, MIN_COLUMNS),  # a terminal, capped and floored
    (None, None, PIPE_COLUMNS), ("0", None, PIPE_COLUMNS), ("wide", None, PIPE_COLUMNS),  # not a terminal
])
def test_columns(monkeypatch, env, terminal, expected):
    if env is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", env)

    def size(_fd=None):
        if terminal is None:
            raise OSError("not a terminal")
        return os.terminal_size((terminal, 24))

    monkeypatch.setattr(os, "get_terminal_size", size)
    assert columns() == expected


def test_prose_hangs_under_its_indent_or_its_bullet():
    assert wrap("a short line", 60) == "a short line"
    assert wrap("  trailing spaces kept when the line fits   ", 60) == "  trailing spaces kept when the line fits   "
    text = "note: " + "word " * 20
    assert wrap(text, 40).splitlines()[1].startswith("    word")
    assert wrap("  " + text, 40).splitlines()[1].startswith("      word")
    assert wrap("- " + "word " * 20, 40).splitlines()[1].startswith("  word")
    assert wrap("  12. " + "word " * 20, 40).splitlines()[1].startswith("      word")


def test_a_term_keeps_its_text_beside_it_where_there_is_room():
    line = f"  {'a term':<20}" + "its text " * 12
    assert [row[:23] for row in wrap(line, 60).splitlines()[1:]] == [" " * 22 + "i"] * 2  # under its text
    narrow = f"  {'a term':<40}" + "its text " * 12  # 18 columns beside the term: the text starts under it
    assert wrap(narrow, 60).splitlines()[:2] == ["  a term", "      " + " ".join(["its text"] * 6)]


def test_tables_commands_and_json_are_never_wrapped():
    row = "  1      2     4  every-2            70,373   59.601  " + "tp 1, pp 1, cp 1, dp 64, zero 3 " * 3
    assert wrap(row, 60) == row.rstrip()
    for line in ("headroom plan --model llama3-70b --seq-len 8192 --global-batch 512 --gpus 64 --tp 8 --pp 2",
                 "$ python -m pytest -q -n auto --dist worksteal tests/test_cli.py tests/test_cli_wrap.py",
                 '{"model": "llama3-70b", "seq_len": 8192, "global_batch": 512, "gpus": 64, "tp": 8}'):
        assert wrap(line, 60) == line


def test_what_is_one_unit_is_never_split():
    """A path longer than the line, a span in backquotes, a flag with its value, an inline command, and a
    figure with its word and its unit move whole to the next line."""
    path = "/a/very/long/path/" + "x" * 80
    assert wrap(f"cannot read {path} here", 60).splitlines() == ["cannot read", f"    {path}", "    here"]
    for unit in ("`headroom db upgrade --db 'sqlite:///r.db'`", "--budget 141GB",
                 "headroom estimate --recompute full --seq-len 4096", "needs 285.8 GB", "pp 1,"):
        for shift in range(40):
            text = "word " * shift + unit + " and more words after it to wrap"
            lines = wrap(text, 60).splitlines()
            assert any(unit in line for line in lines), (shift, lines)


def test_db_info_keeps_its_columns_and_wraps_an_incomplete_run():
    from headroom.cli.db import render_info

    info = {"store": "sqlite:////home/someone/.local/share/headroom/results.db", "engine": "sqlite 3.45.1, WAL "
            "journal", "schema_revision": "0007", "runs": {"ok": 3, "running": 1}, "results": {"matmul": 10},
            "devices": [{"device_name": "NVIDIA H100 80GB HBM3", "hostname": "worker-0", "runs": 3, "results": 13,
                         "last_started_at": "2026-11-30T12:00:00"}],
            "incomplete_runs": [{"run_id": "00000000-0000-4000-8000-000000000003",
                                 "device_name": "NVIDIA H100 80GB HBM3", "hostname": "worker-0.cluster.example.org",
                                 "started_at": "2026-11-30T12:00:00", "results": 5,
                                 "last_result_at": "2026-11-30T12:05:00"}]}
    text = render_info(info)
    lines = wrap(text, 80).splitlines()
    device_table = [line for line in text.splitlines() if line.startswith(("device ", "NVIDIA"))]
    assert [line for line in lines if len(line) > 80] == [line for line in device_table if len(line) > 80]
    run = lines.index(next(line for line in lines if "00000000-0000" in line))
    assert lines[run].startswith("  00000000-0000-4000-8000-000000000003  NVIDIA H100 80GB HBM3 on")
    assert lines[run + 1].startswith(" " * 40) and not lines[run + 1].startswith(" " * 41)  # under its text
    assert collapsed("\n".join(lines)) == collapsed(text)


def test_the_module_constants_are_the_documented_ones():
    assert (MIN_COLUMNS, MAX_COLUMNS, PIPE_COLUMNS, wrapping.HANG, wrapping.MIN_MEASURE) == (60, 100, 100, 4, 30)
