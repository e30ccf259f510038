"""Every option of every command, given adversarial values: never a traceback, never a hang, and a refusal is
one line with exit status 2.

The commands run in this process (``headroom.cli.main.main``), each call under an alarm, in a scratch working
directory (a path-like value may name a file). ``agent run``, ``agent train`` and ``dashboard`` check their
input and then start a measurement (``--settle``'s wait for a quiet host first) or a server: there the fuzz
stops them (`Accepted`), since what it tests is that every value is refused or taken before any work starts.
"""

from __future__ import annotations

import contextlib
import io
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headroom.cli.main import build_parser, main

HARDENING = ("9" * 5000, "x" * 100_000, "a\nb", "\x1b[31mred\x07", "\r", ",".join(["1"] * 5000),
             "postgresql://u:pw@[::1", "2" * 400 + ".5")
"""What the third hardening round added: more digits than Python converts, long text, a line break, terminal
escapes, 5,000 duplicates, a URL that does not parse, a 400-digit number."""
ADVERSARIAL = st.one_of(
    st.sampled_from(["0", "-1", "-0", "1e400", "nan", "inf", "-inf", "", " ", "1.5", "0x10", "10" * 20,
                     str(2**63), str(10**12), "٣", "\u202e8", "\x00", "\ud800", "🙂", "..", "/", "a" * 5000,
                     "80", "80GB", "1e-400GB", "none", "every-0", "every-99999", "true", "{}", "[]",
                     *HARDENING]),
    st.text(min_size=1, max_size=12),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
)
"""Huge, zero, negative, NaN, infinities, wrong types, unicode (digits of another script, bidi controls,
NUL, a lone surrogate), more digits than Python converts, long text, line breaks and terminal escapes, a
list of 5,000 duplicates, a URL that does not parse, and random text."""
UNSHOWN = {"\x1b", "\x07", "\r", "\u202e", "\x00"}
"""What no line of stderr holds raw: a value quoted in an error is escaped (headroom.core.safe_text)."""
LINE_LIMIT = 2_200
"""An error line's characters at most: a quoted value is cut (headroom.core.errors.MESSAGE_LIMIT, headroom.cli.main.ERROR_LIMIT)."""

BASE = {
    ("estimate",): ["--model", "bench-llama-tiny", "--seq-len", "64"],
    ("plan",): ["--model", "bench-llama-tiny", "--seq-len", "64", "--global-batch", "8"],
    ("models",): [],
    ("hardware",): [],
    ("db", "info"): [],
    ("db", "export"): ["out.json"],
    ("db", "import"): ["missing.json"],
    ("db", "merge"): ["missing.db"],
    ("db", "upgrade"): [],
    ("agent", "run"): ["--suite", "smoke", "--device", "cpu"],
    ("agent", "train"): ["--model", "bench-llama-tiny", "--seq-len", "64", "--device", "cpu"],
    ("dashboard",): [],
    ("completion",): ["bash"],
}
"""Each command with a valid invocation; the fuzz replaces one option's value at a time, or the positional
argument (the first word after the command)."""
POSITIONAL = "POSITIONAL"
CALL_LIMIT_S = 20


class Accepted(BaseException):  # noqa: N818  (not an error: main() lets a BaseException through)
    """Raised where a command would start measuring or serving: its input was taken."""


def _accept(*_args, **_kwargs):
    raise Accepted


def _subparser(command: tuple[str, ...]):
    parser = build_parser()
    for word in command:
        parser = next(a for a in parser._actions if a.dest in ("command", "agent_command", "db_command")
                      and getattr(a, "choices", None) and word in a.choices).choices[word]
    return parser


def _options(command: tuple[str, ...]) -> list[str]:
    """The options of ``command`` that take a value, and POSITIONAL when it takes a positional argument."""
    actions = _subparser(command)._actions
    positional = [POSITIONAL] if any(not a.option_strings and a.nargs is None for a in actions) else []
    return positional + sorted(opt for action in actions if action.nargs != 0
                               for opt in action.option_strings if opt.startswith("--"))


CASES = [(command, option) for command in BASE for option in _options(command)]


def _alarm(signum, frame):
    raise TimeoutError(f"a call took more than {CALL_LIMIT_S} s")


def run(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of one in-process call."""
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CALL_LIMIT_S)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exit_:  # argparse's own refusals
                status = exit_.code if isinstance(exit_.code, int) else 2
            except Accepted:
                status = 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, err.getvalue()


def test_the_fuzz_covers_every_option_of_every_command():
    """The cases come from the parser itself, so a new option is fuzzed the day it is added."""
    assert {command for command, _ in CASES} == {c for c in BASE if _options(c)}
    assert {"--model", "--budget", "--gpus", "--hardware", "--export", "--tp", "--db"} <= {
        option for command, option in CASES if command == ("plan",)}
    assert {c for c, _ in CASES} >= {("agent", "run"), ("agent", "train"), ("dashboard",), ("db", "export")}


@pytest.mark.parametrize("command, option", CASES, ids=[f"{' '.join(c)} {o}" for c, o in CASES])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ADVERSARIAL)
def test_an_adversarial_value_is_refused_in_one_line_or_accepted(command, option, value, tmp_path_factory,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg")))
    monkeypatch.delenv("HEADROOM_DB", raising=False)
    monkeypatch.setattr("headroom.agent.runner.run_suite", _accept)
    monkeypatch.setattr("headroom.cli.agent.settle", _accept)  # --settle waits for the host: the start of measuring
    monkeypatch.setattr("headroom.cli.dashboard.serve", _accept)
    argv = [*command, value, *BASE[command][1:]] if option == POSITIONAL else [*command, *BASE[command], option, value]
    _check(command, argv, *run(argv))


@pytest.mark.parametrize("command, option", CASES, ids=[f"{' '.join(c)} {o}" for c, o in CASES])
def test_every_option_takes_the_hardening_values_in_one_bounded_line(command, option, tmp_path, monkeypatch):
    """Every option, deterministically, with each value the third hardening round added (more digits than
    Python converts, long text, line breaks, terminal escapes, 5,000 duplicates, a URL that does not parse)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HEADROOM_DB", raising=False)
    monkeypatch.setattr("headroom.agent.runner.run_suite", _accept)
    monkeypatch.setattr("headroom.cli.agent.settle", _accept)  # --settle waits for the host: the start of measuring
    monkeypatch.setattr("headroom.cli.dashboard.serve", _accept)
    for value in HARDENING:
        argv = [*command, value, *BASE[command][1:]] if option == POSITIONAL else [*command, *BASE[command], option,
                                                                                    value]
        _check(command, argv, *run(argv))


def _check(command: tuple[str, ...], argv: list[str], status: int, err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, (argv, err[:300])
    no_match = command == ("hardware",) and status == 1 and err == ""  # grep's convention, README says so
    assert status in (0, 2, 3) or no_match, (argv, status, err[:300])
    if status == 2:
        assert err.startswith("headroom") and err.count("\n") == 1, (argv, err[:300])
        assert len(err) <= LINE_LIMIT and not UNSHOWN & set(err), (argv, err[:300])
