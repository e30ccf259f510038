"""Where the result store lives, and how a user names another one.

The store is chosen, first match wins, by

1. ``--db URL`` on the command line (or the ``url`` argument of ``open_store``),
2. the ``HEADROOM_DB`` environment variable,
3. the default: the SQLite file ``$XDG_DATA_HOME/headroom/results.db``
   (``~/.local/share/headroom/results.db`` when ``XDG_DATA_HOME`` is unset).

A value is a SQLAlchemy URL (``sqlite:///PATH``, ``postgresql+psycopg://...``)
or a plain file path, which means a SQLite file there. ``postgresql://`` and
``postgres://`` are read as ``postgresql+psycopg://``: psycopg 3 is the one
PostgreSQL driver Headroom installs (extra ``postgres``).

Standard library only, so the CLI can show the default in ``--help`` without
loading SQLAlchemy.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "HEADROOM_DB"
STORE_FILENAME = "results.db"
_POSTGRES_ALIASES = ("postgresql://", "postgres://")


def data_dir() -> Path:
    """Headroom's data directory under the XDG base directory spec."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "headroom"


def default_url() -> str:
    return sqlite_url(data_dir() / STORE_FILENAME)


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The URL of a SQLite file, made absolute so it means the same from any directory."""
    try:
        full = Path(path).expanduser()
    except RuntimeError:  # ``~name`` of a user this system does not have
        from headroom.core.errors import ConfigError

        user = str(path)[1:].split("/", 1)[0]
        raise ConfigError(f"store location {str(path)!r}: this system has no user {user!r} whose home "
                          "'~' could mean; give the path in full") from None
    return f"sqlite:///{full.resolve()}"


def nothing_recorded(url: str | None = None) -> bool:
    """True when no store is named (no ``url``, no ``HEADROOM_DB``) and the default file does not exist.

    Nothing was measured yet: a caller plans from datasheets without opening
    (or importing) the store. A named store that cannot be read is the
    opener's error to report, not "nothing recorded".
    """
    return url is None and ENV_VAR not in os.environ and not (data_dir() / STORE_FILENAME).exists()


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve_url(url: str | None = None) -> str:
    """The store URL from an explicit value, else ``HEADROOM_DB``, else the default file."""
    if url is not None and not url.strip():
        from headroom.core.errors import ConfigError

        raise ConfigError(f"store location {url!r} is empty: give a store's path or URL, or leave the option out for "
                          f"{ENV_VAR} or the default store")
    text = url or os.environ.get(ENV_VAR) or default_url()
    if "\x00" in text or not _is_text(text):
        from headroom.core.errors import ConfigError

        raise ConfigError(f"store location {text!r} holds a NUL or bytes that are not UTF-8 text; "
                          "no SQLite file name or database URL can")
    if "://" not in text:
        return sqlite_url(text)
    for alias in _POSTGRES_ALIASES:
        if text.startswith(alias):
            return "postgresql+psycopg://" + text[len(alias):]
    return text
