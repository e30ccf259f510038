"""The one exception type users see.

Anything a user typed or pointed us at (a preset name, a config.json, a size,
a budget) that cannot be used raises `ConfigError` with a message naming the
bad value and what would be valid. The CLI prints that message on one line and
exits non-zero; any other exception is a bug and keeps its traceback.
"""


MESSAGE_LIMIT = 1_000
"""Characters of a message: one quoting a value of a million characters keeps the value's start."""


class ConfigError(ValueError):
    """Invalid user input: the message names the value and what would be valid (at most ``MESSAGE_LIMIT``
    characters)."""

    def __init__(self, message: str) -> None:
        if len(message) > MESSAGE_LIMIT:
            message = f"{message[:MESSAGE_LIMIT]}... ({len(message):,} characters)"
        super().__init__(message)
