from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def headroom():
    """Run the CLI in a subprocess, as a user would: returns CompletedProcess."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=120
        )

    return run
