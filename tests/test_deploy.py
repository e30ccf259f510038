"""deploy/ and docs/fleet.md stay true: every `headroom` command in them is one the CLI accepts,
the Kubernetes manifests have the shape operators rely on, and bash accepts the Slurm script.

Commands are pulled out of each template the way its runtime would see them:

- shell (the sbatch script, docs/fleet.md's ``sh`` blocks): backslash continuations joined, comments
  dropped, ``headroom`` in command position (line start, after ``;``, ``&&``, ``||``, ``|``, ``(``,
  ``then``, ``do``, ``else``, ``exec``) up to the next shell operator, split with shlex, ``$VAR``,
  ``${VAR}``, ``${VAR:-default}`` and ``$(cmd)`` expanded from the script's own assignments over
  plausible values of what sbatch and the node provide (an unknown variable fails the test);
- the manifests: ``command`` + ``args`` of every container, ``$(VAR)`` expanded from the
  container's ``env`` (an undefined one fails the test: Kubernetes would pass it on literally);
- the Dockerfile: ENTRYPOINT + CMD, JSON arrays.

Each argv is parsed by ``headroom.cli.main.build_parser()``, which exits on a misspelled command or flag.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from headroom.agent.names import SUITES
from headroom.cli.agent import parse_labels
from headroom.cli.main import build_parser

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "deploy" / "slurm" / "headroom-agent.sbatch"
JOB = ROOT / "deploy" / "kubernetes" / "headroom-agent-job.yaml"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "headroom-agent-daemonset.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
FLEET_DOC = ROOT / "docs" / "fleet.md"

PG_URL = "postgresql+psycopg://headroom@db.example/headroom"
# What sbatch, srun and the node give the script; its own variables are computed from these.
SLURM_ENV = {"SLURM_JOB_ID": "4242", "PWD": "/home/ops", "HEADROOM_DB": PG_URL}
SUBSTITUTIONS = {"hostname -s": "gpu-node-001"}
DOC_ENV = {"f": "/shared/headroom/gpu-node-001.json.gz"}
# What Kubernetes fills in for the manifests' env (downward API, Secret).
K8S_VALUES = {"HEADROOM_DB": PG_URL, "NODE_NAME": "gpu-node-001", "JOB_NAME": "headroom-agent"}

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$([A-Za-z_]\w*)|\$\(([^()]*)\)")
_COMMAND = re.compile(r"(?:^|[;&|(]|\b(?:then|do|else|exec)\s)\s*(?=headroom\s)")
_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_OPERATOR = set(";&|()<>")


def expand(text: str, env: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name, default, bare, command = match.groups()
        if command is not None:
            assert command in SUBSTITUTIONS, f"$({command}): give it a plausible output in SUBSTITUTIONS"
            return SUBSTITUTIONS[command]
        name = name or bare
        if name in env:
            return env[name]
        assert default is not None, f"${name} has no value here: set it in the script or add it to the test's env"
        return expand(default, env)

    return _VAR.sub(one, text)


def shell_lines(text: str) -> list[str]:
    """Logical lines: continuations joined, blank lines and comments dropped."""
    lines = (line.strip() for line in text.replace("\\\n", " ").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def shell_commands(text: str, env: dict[str, str]) -> list[list[str]]:
    """Every `headroom` command's argv (after `headroom`), variables expanded as the lines run."""
    env = dict(env)
    commands = []
    for line in shell_lines(text):
        if assignment := _ASSIGNMENT.match(line):
            env[assignment[1]] = " ".join(shlex.split(expand(assignment[2], env)))
            continue
        for match in _COMMAND.finditer(line):
            lexer = shlex.shlex(line[match.end():], posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = []
            for token in lexer:
                if set(token) <= _OPERATOR:
                    break
                words.append(expand(token, env))
            assert words[0] == "headroom"
            commands.append(words[1:])
    return commands


def container_argv(container: dict) -> list[str]:
    """A container's command line after `headroom`, with Kubernetes' $(VAR) from its env."""
    defined = {item["name"] for item in container.get("env", [])}

    def value(match: re.Match[str]) -> str:
        assert match[1] in defined, f"$({match[1]}) is not in the container's env: Kubernetes would leave it as is"
        return K8S_VALUES[match[1]]

    words = [re.sub(r"\$\((\w+)\)", value, word) for word in container["command"] + container.get("args", [])]
    assert words[0] == "headroom"
    return words[1:]


def manifest(path: Path) -> dict:
    (document,) = yaml.safe_load_all(path.read_text())
    return document


def dockerfile_argv() -> list[str]:
    """ENTRYPOINT + CMD (the last of each counts, as for Docker), after `headroom`."""
    instructions = dict(line.split(None, 1) for line in shell_lines(DOCKERFILE.read_text()))
    entrypoint = json.loads(instructions["ENTRYPOINT"])
    assert entrypoint == ["headroom"]
    return json.loads(instructions["CMD"])


def fleet_doc_commands() -> list[list[str]]:
    text = FLEET_DOC.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)
    inline = re.findall(r"(?<!`)`(headroom [^`]+)`", text)
    return shell_commands("\n".join(blocks + inline), DOC_ENV)


def sources() -> dict[str, list[list[str]]]:
    job, daemonset = manifest(JOB), manifest(DAEMONSET)
    return {
        "sbatch": shell_commands(SBATCH.read_text(), SLURM_ENV),
        "job": [container_argv(c) for c in job["spec"]["template"]["spec"]["containers"]],
        "daemonset": [container_argv(c) for c in daemonset["spec"]["template"]["spec"]["initContainers"]],
        "dockerfile": [dockerfile_argv()],
        "fleet.md": fleet_doc_commands(),
    }


# The commands each template must hold: a template that loses one (or an extraction that finds nothing) fails.
EXPECTED = {
    "sbatch": ["agent run", "agent run", "db export"],
    "job": ["agent run"],
    "daemonset": ["agent run"],
    "dockerfile": ["agent run"],
    "fleet.md": ["db upgrade", "agent run", "agent run", "db export", "db import", "db merge", "db info",
                 "dashboard", "dashboard", "agent run", "db info"],
}


def parse(argv: list[str]):
    """The parsed command line; a failure when argparse refuses it or a flag is abbreviated."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:
        pytest.fail(f"`headroom {shlex.join(argv)}` is not a valid command (argparse exit {exit.code})")
    # argparse takes an unambiguous prefix (--suit for --suite); a template spells flags in full,
    # so that a later flag sharing the prefix cannot break it.
    words = list(argv)
    while words and (subcommands := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]):
        parser = subcommands[0].choices[words.pop(0)]
    flags = {option for action in parser._actions for option in action.option_strings}
    for word in words:
        if word.startswith("--") and word.split("=")[0] not in flags:
            pytest.fail(f"`headroom {shlex.join(argv)}`: {word} is not a flag of its own (spell flags in full)")
    return args


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_headroom_command_is_valid(name):
    commands = sources()[name]
    assert [" ".join(argv[:1] if argv[0] == "dashboard" else argv[:2]) for argv in commands] == EXPECTED[name]
    for argv in commands:
        args = parse(argv)
        if args.command == "agent":
            assert args.suite in SUITES
            parse_labels(args.label)  # KEY=VALUE each, as the agent will require
        if name != "fleet.md" and args.command == "agent":
            assert (args.suite, args.device) == ("standard", "all"), argv


def test_the_sbatch_commands_write_where_the_fleet_reads():
    direct, local, export = shell_commands(SBATCH.read_text(), SLURM_ENV)
    labels = ["--label", "slurm_job=4242", "--label", "node=gpu-node-001"]
    store = "sqlite:////tmp/headroom-4242-gpu-node-001.db"  # four slashes: an absolute path
    assert direct == ["agent", "run", "--suite", "standard", "--device", "all", "--db", PG_URL, *labels]
    assert local == ["agent", "run", "--suite", "standard", "--device", "all", "--db", store, *labels]
    assert export == ["db", "export", "/home/ops/headroom-bundles/4242/gpu-node-001.json.gz", "--db", store]


def test_a_misspelled_flag_fails():
    with pytest.raises(pytest.fail.Exception, match="--sute"):
        parse(["agent", "run", "--sute", "standard"])
    with pytest.raises(pytest.fail.Exception):
        parse(["agent", "run", "--suite", "fastest"])
    with pytest.raises(pytest.fail.Exception, match="--suit is not a flag"):
        parse(["agent", "run", "--suit", "standard"])  # argparse itself would take the prefix
    parse(["db", "export", "out.json.gz", "--db=results.db"])


def test_sbatch_directives():
    text = SBATCH.read_text()
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    directives = [line.split(None, 1)[1] for line in lines if line.startswith("#SBATCH")]
    # sbatch stops reading #SBATCH lines at the first command.
    assert all(not line.startswith("#SBATCH") for line in lines[first_command:])
    assert lines[0] == "#!/bin/bash" and lines[first_command] == "set -euo pipefail"
    assert {"--ntasks-per-node=1", "--exclusive", "--gpus-per-node=8"} <= set(directives)
    assert re.search(r"^srun --ntasks-per-node=1 .*bash -c '$", text, re.MULTILINE)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_accepts_the_sbatch_script():
    text = SBATCH.read_text()
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    # The per-node body is one single-quoted string to bash -n above: check it as a script of its own.
    (body,) = re.findall(r"bash -c '\n(.*?)\n'\n", text, re.DOTALL)
    subprocess.run(["bash", "-n"], input=body, text=True, check=True)
    assert body.startswith("set -euo pipefail\n")


def check_agent_container(container: dict) -> None:
    assert container["command"] == ["headroom"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    env = {item["name"]: item for item in container["env"]}
    assert env["HEADROOM_DB"]["valueFrom"] == {"secretKeyRef": {"name": "headroom-db", "key": "url"}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def check_pod(pod: dict) -> None:
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}  # a string: Kubernetes refuses a boolean
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_job_manifest():
    job = manifest(JOB)
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("batch/v1", "Job", "headroom-agent")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert isinstance(spec["completions"], int) and spec["completions"] == spec["parallelism"] >= 1
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # backoffLimitPerIndex requires it
    check_pod(pod)
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # The anti-affinity must select the Job's own pods, or it keeps nothing apart.
    assert term["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    check_agent_container(container)
    assert "initContainers" not in pod


def test_daemonset_manifest():
    daemonset = manifest(DAEMONSET)
    assert (daemonset["apiVersion"], daemonset["kind"]) == ("apps/v1", "DaemonSet")
    spec = daemonset["spec"]
    # The API refuses a selector that does not match the template's labels.
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    check_pod(pod)
    assert "restartPolicy" not in pod  # a DaemonSet allows only Always, the default
    (agent,) = pod["initContainers"]
    check_agent_container(agent)
    (pause,) = pod["containers"]
    assert pause["image"].startswith("registry.k8s.io/pause:") and "command" not in pause
    assert "nvidia.com/gpu" not in str(pause["resources"])


def test_dockerfile():
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^FROM (\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda12\.\d+-cudnn9-runtime", base)
    assert 'RUN pip install --no-cache-dir ".[agent,postgres]"' in text
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = set(project["tool"]["setuptools"]["package-dir"].values())  # the folders headroom.* installs from
    copied = set(re.findall(r"^COPY (\S+) \./\1$", text, re.MULTILINE))
    assert copied == packages, "the image must copy every package pyproject.toml installs"
    assert "COPY pyproject.toml README.md ./" in text  # the build reads both (readme = README.md)
