"""What goes wrong with a result store, said so that a user can act on it.

Every error here is a `headroom.core.errors.ConfigError`: the CLI prints it as one line
and exits with status 2, and the dashboard shows the message as it is. Each
message names the store (password hidden) and what would make it work.
"""

from __future__ import annotations

from headroom.core.errors import ConfigError


class StoreError(ConfigError):
    """A store cannot be opened or written: not a Headroom store, damaged, too new, unreachable."""


class OutdatedStoreError(StoreError):
    """A reader met a store at an older schema revision; readers never migrate.

    ``upgrade_command`` is the command line that brings the store to the
    code's schema (a writer opening the store does the same).
    """

    def __init__(self, message: str, upgrade_command: str) -> None:
        super().__init__(message)
        self.upgrade_command = upgrade_command


class DamagedStoreError(StoreError):
    """SQLite found a store's file damaged: a page that is not what it should be, or no database at all.

    Nothing a command can repair: the user restores the file or uses another
    store. ``url`` names the store, so a command that holds two (``db
    merge``) can say which one it is (`naming`).
    """

    def __init__(self, url: str, reason: str, *, role: str = "", option: str = "--db") -> None:
        self.url, self.reason = url, reason
        named = f"the {role} {url}" if role else url
        super().__init__(f"cannot read {named}: {reason}; it is not a readable Headroom store "
                         f"(restore it from a backup or a bundle, or point {option} at another store)")

    def naming(self, role: str, option: str) -> DamagedStoreError:
        """The same error, saying which store of a command it is (``merge source``) and which option names it."""
        return DamagedStoreError(self.url, self.reason, role=role, option=option)


class BundleError(StoreError):
    """A bundle cannot be read or imported; nothing from it was written."""
