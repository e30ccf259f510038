"""README.md stays true: CI runs its test command, and its flags exist."""

import re
from pathlib import Path

from cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```sh\n(.+?)\n```", README)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_lists_every_estimate_flag():
    estimate = build_parser()._subparsers._group_actions[0].choices["estimate"]
    flags = {opt for action in estimate._actions for opt in action.option_strings if opt.startswith("--")}
    documented = set(re.findall(r"\| `(--[a-z-]+)`", README))
    assert flags - {"--help"} == documented
