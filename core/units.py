"""Byte units: GB is 1e9 bytes, GiB is 2**30. Bytes are always ints.

User input accepts both families ("80GB", "80 GiB", "81920MiB", "80e9").
Output says which one it uses.
"""

from __future__ import annotations

import math
import re

from headroom.core.errors import ConfigError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

_UNITS = {
    "": 1, "B": 1,
    "KB": KB, "MB": MB, "GB": GB, "TB": TB,
    "KIB": KiB, "MIB": MiB, "GIB": GiB, "TIB": TiB,
}
_BITS = {"Kb": "kilo", "Mb": "mega", "Gb": "giga", "Tb": "tera"}
"""Units that read as bits (a network's Gb/s), refused in a size: a lower-case b after an upper-case prefix."""
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
        if match["unit"] in _BITS:
            raise ConfigError(
                f"unit {match['unit']!r} in {text!r} reads as {_BITS[match['unit']]}bits; a memory size is in "
                f"bytes: use {unit[0]}B (powers of 1000) or {unit[0]}iB (powers of 1024)"
            )
        if unit not in _UNITS:
            raise ConfigError(
                f"unknown unit {match['unit']!r} in {text!r}: use B, KB, MB, GB, TB "
                "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            )
    scaled = value * _UNITS[unit]
    if not math.isfinite(scaled):
        raise ConfigError(f"size {text!r} is too large to be a size in bytes")
    size = round(scaled)
    if size <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return size


MIN_BUDGET_BYTES = 2**20
"""1 MiB: no accelerator has less memory per device."""
MAX_BUDGET_BYTES = 10**15
"""1 PB: a thousand times the largest accelerator memory sold."""

_BUDGET_EXAMPLE = "give a number with its unit, such as 80GB or 79.6GiB (GB = 1e9 bytes, GiB = 2**30 bytes)"


def parse_budget(text: str) -> int:
    """A memory budget per device: a size with a unit ("80GB", "80GiB"), between 1 MiB and 1 PB.

    A bare number is refused rather than read as bytes: ``--budget 80`` means 80 GB to a person. A negative
    or zero size and text that is not a number with a unit are refused naming the value and an example.
    """
    shown = str(text).strip()
    negative, body = shown.startswith("-"), shown[1:] if shown.startswith(("-", "+")) else shown
    match = _SIZE.match(body)
    if match is None:
        raise ConfigError(f"budget {text!r} is not a size; {_BUDGET_EXAMPLE}")
    if negative or float(match["number"]) == 0:
        raise ConfigError(f"budget {text!r} is not a positive size; {_BUDGET_EXAMPLE}")
    if not match["unit"]:
        raise ConfigError(f"budget {text!r} has no unit; did you mean '{body}GB'? (GB = 1e9 bytes, GiB = 2**30)")
    size = parse_bytes(body)
    if not MIN_BUDGET_BYTES <= size <= MAX_BUDGET_BYTES:
        raise ConfigError(f"budget {text!r} is outside 1 MiB to 1 PB: a device's memory is in that range")
    return size


def format_bytes(n: int, unit: str = "GB", digits: int = 2) -> str:
    """Format bytes in one named unit, e.g. format_bytes(3_623_878_656) == '3.62 GB'."""
    scale = _UNITS[unit.upper()]
    return f"{n / scale:,.{digits}f} {unit}"


def format_duration(seconds: float) -> str:
    """Whole seconds, with minutes from a minute up: ``format_duration(95) == '1m35s'``."""
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
