"""A cluster's network in a small TOML file kept beside the cluster: ``headroom plan --network FILE`` reads one,
and the Plan page takes one uploaded.

    # cluster.toml: 8 A100s a node on NVLink 3, 8 HDR NICs a node
    gpus_per_node = 8
    intra_node = "nvlink3"
    interconnect = "8x200g"   # or a link's key: ib-hdr, roce-400g, ...

Every key is optional; a setting given beside the file (a flag, a page input) wins over the file's value. The
values are checked as the flags are (headroom.core.specs.interconnect.network_settings); a file that is too
large, not UTF-8 or not TOML is refused with the reason.
"""

from __future__ import annotations

import tomllib

from headroom.core.errors import ConfigError
from headroom.core.specs.interconnect import NetworkSettings, network_settings

MAX_BYTES = 64 * 1024
"""A network file is a few lines; anything larger is not one."""


def parse_network_file(data: bytes, where: str) -> NetworkSettings:
    """The settings in a network file's ``data`` (at most MAX_BYTES + 1 of them read), named ``where`` in errors;
    ConfigError says what is wrong with it."""
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{where}: over {MAX_BYTES // 1024} KiB; a network file is a few lines of TOML "
                          "(gpus_per_node, intra_node, interconnect)")
    try:
        values = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text; a network file is a few lines of TOML") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: not TOML ({err}); write e.g. interconnect = \"8x200g\"") from None
    return network_settings(values, where)
