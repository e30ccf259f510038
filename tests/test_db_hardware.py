"""headroom.db.hardware.resolve_hardware: a measured device from the store, else a datasheet row; no database when none is needed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from headroom.core.errors import ConfigError
from headroom.db.errors import StoreError
from headroom.db.hardware import resolve_hardware
from headroom.db.store import open_store
from tests.db_support import record_run, sqlite_url  # noqa: F401  (fixture)

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def measured_url(sqlite_url):  # noqa: F811
    """A store holding one H100 run (tests.db_support.results: a bf16 matmul, a copy, an attention)."""
    with open_store(sqlite_url, mode="write") as store:
        record_run(store)
    return sqlite_url


def test_a_measured_device_comes_with_its_calibration(measured_url):
    profile, calibration = resolve_hardware("h100", measured_url)  # a unique substring of the stored name
    assert profile.source == "measured" and profile.name == H100
    assert profile.hbm_bytes_per_s == 2147.5e9  # the stored copy
    assert calibration is not None and calibration.device == H100
    with open_store(measured_url, mode="read") as store:
        assert resolve_hardware(H100, source="measured", store=store) == (profile, calibration)


def test_a_datasheet_row_when_nothing_measured_matches(measured_url):
    profile, calibration = resolve_hardware("a100-sxm-80gb", measured_url)
    assert (profile.source, profile.name, calibration) == ("datasheet", "a100-sxm-80gb", None)
    # "datasheet" never reads the store, even for a name a measured device would claim.
    profile, calibration = resolve_hardware(H100, measured_url, source="datasheet")
    assert (profile.source, profile.name, calibration) == ("datasheet", "h100-sxm", None)


def test_errors_name_what_would_be_valid(measured_url, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown hardware 'h1000'; .* \(measured devices in the store: NVIDIA H100"):
        resolve_hardware("h1000", measured_url)
    with pytest.raises(ConfigError, match=r"no measured device 'a100-sxm-80gb' in the store; measured: NVIDIA H100"):
        resolve_hardware("a100-sxm-80gb", measured_url, source="measured")
    with pytest.raises(StoreError, match="no result store at"):
        resolve_hardware("h100-sxm", str(tmp_path / "nowhere.db"))  # a named store must be readable
    with pytest.raises(ValueError, match="source must be one of auto, measured, datasheet"):
        resolve_hardware("h100-sxm", source="store")


def test_datasheet_planning_without_a_store_loads_no_database(tmp_path):
    code = (
        "import sys\nfrom headroom.db.hardware import resolve_hardware\n"
        "profile, calibration = resolve_hardware('h100-sxm')\n"
        "print(profile.source, calibration, sorted(m for m in ('sqlalchemy', 'alembic') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.split() == ["datasheet", "None", "[]"]
    assert not (tmp_path / "headroom").exists(), "resolving hardware must never create a store"


def test_planning_from_a_store_loads_no_migration_tooling(measured_url):
    """Readers recognise a store without Alembic (and its Mako and Pygments): only writers migrate."""
    code = (
        "import sys\nfrom headroom.db.hardware import resolve_hardware\n"
        f"profile, calibration = resolve_hardware('h100', {measured_url!r})\n"
        "print(profile.source, sorted(m for m in ('sqlalchemy', 'alembic', 'mako', 'pygments') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["measured", "['sqlalchemy']"]


def test_a_datasheet_plan_beside_a_store_reads_its_names_without_the_orm(measured_url, tmp_path):
    """`plan --hardware h100-sxm` with a store present (every user after the quick start) imported SQLAlchemy to
    learn that no measured device goes by that name: 3x `estimate`'s time. sqlite3 reads the names instead; a
    name that may be measured still opens the store properly."""
    code = (
        "import sys\nfrom headroom.db.hardware import resolve_hardware\n"
        f"profile, calibration = resolve_hardware(sys.argv[1], {measured_url!r})\n"
        "print(profile.source, 'sqlalchemy' in sys.modules)"
    )
    for name, expected in (("h100-sxm", "datasheet False"), ("h100", "measured True"), ("latest", "measured True")):
        result = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, check=True,
                                timeout=120)
        assert result.stdout.split() == expected.split(), name


def test_the_names_a_sqlite_store_holds_or_none_where_sqlite3_cannot_tell(measured_url, tmp_path):
    from headroom.db.device_names import could_name, matching_names, sqlite_device_names

    names = sqlite_device_names(measured_url)
    assert names == ["NVIDIA H100 80GB HBM3"]
    assert matching_names(names, "nvidia h100 80gb hbm3") == names and matching_names(names, "H100") == names
    assert could_name(names, "latest") and not could_name(names, "h100-sxm")
    (tmp_path / "garbage.db").write_bytes(b"not a database at all" * 100)
    for url in ("postgresql+psycopg://u@h/x", str(tmp_path / "missing.db"), str(tmp_path / "garbage.db"),
                f"sqlite:///{tmp_path / 'missing.db'}?mode=ro"):
        assert sqlite_device_names(url) is None, url
