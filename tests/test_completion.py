"""``headroom completion bash|zsh|fish``: written from the parser, so every command and option completes. The
bash script runs in a real bash with the words a user typed; zsh's is the same function under bashcompinit;
fish's lines are checked against the parser, and each script by its shell's syntax check where that shell is
installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from headroom.cli.completion import leaf_commands
from headroom.cli.main import build_parser
from headroom.core.specs.presets import PRESETS

COMMANDS = leaf_commands(build_parser())


def _bash_complete(script: str, *words: str) -> list[str]:
    """What the script offers after ``words`` (the last is the word being completed), as bash computes it."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _headroom; "
               "printf '%s\\n' \"${COMPREPLY[@]}\"")
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.split()


@pytest.fixture(scope="module")
def bash() -> str:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    from headroom.cli.completion import bash_script

    return bash_script(COMMANDS)


def test_the_parser_is_walked_whole():
    words = {" ".join(c.words) for c in COMMANDS}
    assert {"", "estimate", "plan", "agent", "agent run", "agent train", "models", "hardware", "db", "db info",
            "db import", "db export", "db merge", "db upgrade", "dashboard", "completion"} == words
    plan = next(c for c in COMMANDS if c.words == ("plan",))
    flags = {flag for option in plan.options for flag in option.flags}
    assert {"--model", "--budget", "--gpus", "--interconnect", "--recompute", "--export"} <= flags


@pytest.mark.parametrize(("typed", "offered"), [
    (("headroom", ""), ["estimate", "plan", "agent", "models", "hardware", "db", "dashboard", "completion"]),
    (("headroom", "db", "im"), ["import"]),
    (("headroom", "agent", ""), ["run", "train"]),
    (("headroom", "plan", "--prec"), ["--precision"]),
    (("headroom", "plan", "--precision", "bf16"), ["bf16-pure", "bf16-master", "bf16-fp32grad"]),
    (("headroom", "plan", "--interconnect", "ib"), ["ib-hdr", "ib-ndr"]),
    (("headroom", "db", "import", "--d"), ["--db"]),
    (("headroom", "agent", "train", "--rec"), ["--recompute"]),
    (("headroom", "completion", ""), ["bash", "zsh", "fish"]),
    (("headroom", "plan", "--model", "llama3"), ["llama3-8b", "llama3-70b", "llama3.2-1b", "llama3.1-405b"]),
])
def test_bash_offers_what_the_parser_takes(bash, typed, offered):
    assert _bash_complete(bash, *typed) == offered


def test_bash_offers_files_where_a_path_goes(bash, tmp_path, monkeypatch):
    (tmp_path / "results.json.gz").write_text("")
    monkeypatch.chdir(tmp_path)
    assert _bash_complete(bash, "headroom", "db", "import", "res") == ["results.json.gz"]
    assert _bash_complete(bash, "headroom", "plan", "--db", "res") == ["results.json.gz"]


def test_every_option_of_every_command_is_in_each_script(run_cli):
    scripts = {shell: run_cli("completion", shell).stdout for shell in ("bash", "zsh", "fish")}
    assert scripts["zsh"].startswith("# headroom completion zsh") and "bashcompinit" in scripts["zsh"]
    assert scripts["bash"].split("\n", 1)[1] in scripts["zsh"]
    for command in COMMANDS:
        for option in command.options:
            for flag in option.flags:
                assert flag in scripts["bash"], (command.words, flag)
                fish_flag = f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
                assert fish_flag in scripts["fish"], (command.words, flag)
    assert " ".join(PRESETS) in scripts["fish"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_script_passes_its_shells_syntax_check(run_cli, shell, tmp_path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here")
    script = tmp_path / f"headroom.{shell}"
    script.write_text(run_cli("completion", shell).stdout)
    check = [shell, "--no-execute", str(script)] if shell == "fish" else [shell, "-n", str(script)]
    assert subprocess.run(check, capture_output=True, text=True, timeout=60).returncode == 0
