"""A small file a flag names (``--network FILE``, ``--nccl-tests FILE``), read whole or refused with the reason: a
missing or unreadable file, or a name no file can have."""

from __future__ import annotations

from pathlib import Path

from headroom.core.errors import ConfigError


def read_user_file(path: str, where: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the file at ``path`` (the parser refuses more than ``limit``), named ``where``
    in errors."""
    if not path.strip():
        raise ConfigError(f"{where.strip()}: an empty file name; give the file's path")
    try:
        with Path(path).open("rb") as f:
            return f.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
    except ValueError:  # a NUL in the name: no file can be called that
        raise ConfigError(f"{where}: not a file name (it holds a NUL character)") from None
