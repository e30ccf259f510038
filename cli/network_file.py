"""``--network FILE``: read a cluster's network file for ``headroom plan`` (headroom.core.specs.network_file says
what it holds). A file that is missing or unreadable is refused with the reason, as is one the parser refuses."""

from __future__ import annotations

from pathlib import Path

from headroom.core.errors import ConfigError
from headroom.core.safe_text import printable
from headroom.core.specs.interconnect import NetworkSettings
from headroom.core.specs.network_file import MAX_BYTES, parse_network_file


def read_network_file(path: str) -> NetworkSettings:
    """The settings in the network file at ``path``; ConfigError says what is wrong with it."""
    where = f"--network {printable(path)}"
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
    except ValueError:  # a NUL in the name: no file can be called that
        raise ConfigError(f"{where}: not a file name (it holds a NUL character)") from None
    return parse_network_file(data, where)


__all__ = ["MAX_BYTES", "read_network_file"]
