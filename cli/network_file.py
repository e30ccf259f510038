"""``--network FILE``: read a cluster's network file for ``headroom plan`` (headroom.core.specs.network_file says
what it holds). A file that is missing or unreadable is refused with the reason, as is one the parser refuses."""

from __future__ import annotations

from headroom.cli.user_file import read_user_file
from headroom.core.safe_text import printable
from headroom.core.specs.interconnect import NetworkSettings
from headroom.core.specs.network_file import MAX_BYTES, parse_network_file


def read_network_file(path: str) -> NetworkSettings:
    """The settings in the network file at ``path``; ConfigError says what is wrong with it."""
    where = f"--network {printable(path)}"
    return parse_network_file(read_user_file(path, where, MAX_BYTES), where)


__all__ = ["MAX_BYTES", "read_network_file"]
