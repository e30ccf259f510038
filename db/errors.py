"""What goes wrong with a result store, said so that a user can act on it.

Every error here is a `core.errors.ConfigError`: the CLI prints it as one line
and exits with status 2, and the dashboard shows the message as it is. Each
message names the store (password hidden) and what would make it work.
"""

from __future__ import annotations

from core.errors import ConfigError


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


class BundleError(StoreError):
    """A bundle cannot be read or imported; nothing from it was written."""
