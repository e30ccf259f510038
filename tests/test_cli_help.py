"""`--help` in argument groups, every checkpoint policy defined, prose wrapped to the terminal's width."""

from __future__ import annotations

import pytest

from headroom.core.specs.recompute import POLICY_MEANINGS


@pytest.mark.parametrize("command", [("plan",), ("estimate",), ("agent", "train")])
def test_every_command_taking_a_policy_defines_each_one(run_cli, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "72")
    text = run_cli(*command, "--help").stdout
    _, epilog = text.split("checkpoint policies (--recompute):\n")
    for name, meaning in POLICY_MEANINGS.items():
        assert f"\n  {name}: " in f"\n{epilog}", name
        assert " ".join(meaning.split()[:3]) in " ".join(epilog.split()), name
    assert max(len(line) for line in epilog.splitlines()) <= 72
    assert all(line.startswith(("  ", "    ")) for line in epilog.splitlines())


def _sections(text: str) -> dict[str, str]:
    """Each heading of the help (a line at the margin ending in a colon) with the lines under it."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = sections.setdefault(line, [])
        elif current is not None:
            current.append(line)
    return {heading: "\n".join(lines) for heading, lines in sections.items()}


def test_plan_help_reads_in_groups(run_cli):
    sections = _sections(run_cli("plan", "--help").stdout)
    assert list(sections) == ["options:", "model:", "training:", "hardware:", "layout:", "configuration:", "output:",
                              "checkpoint policies (--recompute):"]
    for heading, flags in {"model:": ("--model",), "training:": ("--global-batch", "--seq-len", "--precision"),
                           "hardware:": ("--hardware", "--budget", "--db"),
                           "layout:": ("--gpus", "--interconnect", "--tp", "--zero", "--ep"),
                           "configuration:": ("--micro-batch", "--accumulation", "--recompute"),
                           "output:": ("--json", "--export", "--train-tokens")}.items():
        for flag in flags:
            assert f"\n  {flag} " in f"\n{sections[heading]}", (heading, flag)
