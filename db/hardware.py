"""Which hardware a plan is for: a device measured in the store, else a datasheet row.

One resolution, shared by ``headroom plan --hardware`` and the dashboard's Plan
page. ``source`` says where to look:

- ``auto``: the measured device ``name`` means (headroom.db.profiles.find_device: exact,
  a unique substring, or ``latest``), else the datasheet row
  (headroom.core.specs.hardware.get_hardware: a key such as ``h100-sxm``, or a name torch
  would report). A CLI flag is this.
- ``measured``: only the store (a dashboard option "measured: NAME").
- ``datasheet``: only the table (a dashboard option "datasheet: KEY"); never
  touches the store, so a measured "NVIDIA H200" cannot stand in for ``h200``.

A measured device comes with its calibration; a datasheet row with None.

Importing this module loads no SQLAlchemy, and neither does a datasheet row
resolved while no store exists (no ``url``, no ``HEADROOM_DB``, no default
file), or while a SQLite store holds no device by that name (read with
sqlite3, headroom.db.device_names): planning from datasheets needs no ORM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration
from headroom.core.specs.hardware import get_hardware
from headroom.core.timing.step import HardwareProfile, datasheet_profile
from headroom.db.device_names import could_name, sqlite_device_names
from headroom.db.location import nothing_recorded

if TYPE_CHECKING:
    from headroom.db.store import Store

Source = Literal["auto", "measured", "datasheet"]
SOURCES: tuple[Source, ...] = ("auto", "measured", "datasheet")
Measured = tuple[HardwareProfile, Calibration]


def resolve_hardware(
    name: str, url: str | None = None, *, source: Source = "auto", store: Store | None = None,
) -> tuple[HardwareProfile, Calibration | None]:
    """The profile of the hardware ``name`` and, when measured, its calibration.

    ``url`` names the store (else ``HEADROOM_DB``, else the default file);
    ``store`` is an already open one to read instead (the dashboard keeps one
    per URL). A named store that cannot be read raises headroom.db.errors.StoreError;
    a name found nowhere raises ConfigError listing what would be valid.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    devices: list[str] = []
    if source != "datasheet":
        measured, devices = _measured(name, url, store)
        if measured is not None:
            return measured
        if source == "measured":
            raise ConfigError(f"no measured device {name!r} in the store; measured: {'; '.join(devices) or 'none'}")
    try:
        return datasheet_profile(get_hardware(name)), None
    except ConfigError as err:
        if not devices:
            raise
        raise ConfigError(f"{err} (measured devices in the store: {'; '.join(devices)})") from None



def _measured(name: str, url: str | None, store: Store | None) -> tuple[Measured | None, list[str]]:
    """(the device ``name`` means with its calibration, else None; the store's device names when none matched)."""
    if store is None and nothing_recorded(url):
        return None, []
    if store is None and (names := sqlite_device_names(url)) is not None and not could_name(names, name):
        return None, names  # no measured device by that name: the store need not be opened
    from headroom.db.store import (
        open_store,  # SQLAlchemy, only once a store may hold the device
    )

    if store is not None:
        return _read(store, name)
    with open_store(url, mode="read") as opened:
        return _read(opened, name)


def _read(store: Store, name: str) -> tuple[Measured | None, list[str]]:
    from headroom.db.profiles import device_names, measured_in

    with store.session() as session:
        measured = measured_in(session, name)
        return measured, [] if measured else device_names(session)
