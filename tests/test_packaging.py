"""What `pip install` puts in site-packages: one name, ``headroom``, holding every module of the repository.

The folders stay at the repository's top level (core/, agent/, db/, dashboard/, cli/); pyproject.toml maps
each to ``headroom.<folder>``. The wheel is built from a copy of those folders, as pip builds it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "agent", "db", "dashboard", "cli")
DATA = ("db/migrations/script.py.mako", "db/migrations/README.md")
"""Files besides modules that the store's migrations need installed (pyproject.toml's package-data)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(dist)!r}))"
    result = subprocess.run([sys.executable, "-c", build], cwd=source, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    name = result.stdout.strip().splitlines()[-1]
    return zipfile.ZipFile(dist / name)


def test_the_only_top_level_name_installed_is_headroom(wheel):
    names = {entry.split("/")[0] for entry in wheel.namelist() if ".dist-info/" not in entry}
    assert names == {"headroom"}
    top_level = [entry for entry in wheel.namelist() if entry.endswith(".dist-info/top_level.txt")]
    if top_level:  # setuptools writes it; the wheel format does not require it
        assert wheel.read(top_level[0]).decode().split() == ["headroom"]


def test_every_module_of_the_repository_is_installed_under_headroom(wheel):
    modules = {f"headroom/{path.relative_to(ROOT).as_posix()}" for name in PACKAGES
               for path in (ROOT / name).rglob("*.py") if "__pycache__" not in path.parts}
    installed = {entry for entry in wheel.namelist() if entry.endswith(".py")}
    assert modules - installed == set(), "a folder of modules is missing from pyproject.toml's packages"
    assert installed - modules == set()
    assert {f"headroom/{path}" for path in DATA} <= set(wheel.namelist())


def test_the_command_runs_the_installed_cli(wheel):
    scripts = [entry for entry in wheel.namelist() if entry.endswith(".dist-info/entry_points.txt")]
    assert "headroom = headroom.cli.main:main" in wheel.read(scripts[0]).decode().splitlines()
