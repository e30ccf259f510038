"""Run a benchmark from a checkout that is not pip-installed (a lent GPU box with no registry).

Installed, the repository's folders import as ``headroom.core``, ``headroom.agent``, ...
(pyproject.toml maps them). Where ``headroom`` is not installed, `use_checkout` makes a
``headroom`` folder of links to this checkout's folders in a temporary directory and puts
it first on ``sys.path`` and on ``PYTHONPATH``, so the benchmark, the processes it forks
and the ``python -m headroom.cli.main`` it runs import this checkout alike.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "agent", "db", "dashboard", "cli")


def use_checkout() -> None:
    """Make ``import headroom.<package>`` work from this checkout; nothing when it already does."""
    if importlib.util.find_spec("headroom") is not None:
        return
    base = Path(tempfile.mkdtemp(prefix="headroom-checkout-"))
    (base / "headroom").mkdir()
    for name in PACKAGES:
        (base / "headroom" / name).symlink_to(ROOT / name, target_is_directory=True)
    sys.path.insert(0, str(base))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(base), os.environ.get("PYTHONPATH")]))
