"""Byte units: GB is 1e9 bytes, GiB is 2**30. Bytes are always ints.

User input accepts both families ("80GB", "80 GiB", "81920MiB", "80e9").
Output says which one it uses.
"""

from __future__ import annotations

import re

from core.errors import ConfigError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

_UNITS = {
    "": 1, "B": 1,
    "KB": KB, "MB": MB, "GB": GB, "TB": TB,
    "KIB": KiB, "MIB": MiB, "GIB": GiB, "TIB": TiB,
}
_SIZE = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """Parse "80GB", "80GiB", "81920MiB", "1.5e9" or an int into bytes.

    >>> parse_bytes("80GB"), parse_bytes("1GiB"), parse_bytes("512 MiB")
    (80000000000, 1073741824, 536870912)
    """
    if isinstance(text, int):
        value, unit = text, ""
    else:
        match = _SIZE.match(text)
        if match is None:
            raise ConfigError(
                f"cannot read {text!r} as a size: expected a number and a unit such as "
                "'80GB', '80GiB' or '81920MiB' (GB = 1e9 bytes, GiB = 2**30 bytes)"
            )
        value, unit = float(match["number"]), match["unit"].upper()
        if unit not in _UNITS:
            raise ConfigError(
                f"unknown unit {match['unit']!r} in {text!r}: use B, KB, MB, GB, TB "
                "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            )
    size = round(value * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return size


def format_bytes(n: int, unit: str = "GB", digits: int = 2) -> str:
    """Format bytes in one named unit, e.g. format_bytes(3_623_878_656) == '3.62 GB'."""
    scale = _UNITS[unit.upper()]
    return f"{n / scale:,.{digits}f} {unit}"
