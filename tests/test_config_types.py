"""Every field of every supported config.json, wrongly typed, is refused in a bounded line (or read, where the
type is one the field takes), never an internal error, and never allocates more than the config is worth: a
deepseek_v3 config whose n_shared_experts was a string once repeated the string by the experts' width (430 MB,
a 104,857,716-character error line)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from headroom.core.errors import MESSAGE_LIMIT, ConfigError
from headroom.core.specs.hf_config import (
    parse_hf_config,
    read_hf_config,
    spec_from_config_file,
)

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "hf").glob("*.json"))
WRONG = ("7", "1e3", [7], {"n": 7}, True, 10**400, -3, 0, 1.5, "x" * 100_000)
"""A number as text, a list, an object, a boolean, an integer no float holds, negative, zero, a fraction, a
long string."""
NAMES = ("_name_or_path", "architectures", "model_type", "name")
ALLOCATION_LIMIT = 20_000_000
"""Bytes a config of a few kilobytes may allocate while it is read (each case reads a fixture's dict)."""


def _fields(path: Path) -> list[str]:
    return [key for key, value in json.loads(path.read_text()).items()
            if key not in NAMES and not isinstance(value, dict)]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: path.stem)
def test_a_wrongly_typed_field_is_refused_in_a_bounded_line(path):
    base = json.loads(path.read_text())
    for key in _fields(path):
        for wrong in WRONG:
            tracemalloc.start()
            try:
                spec_from_config_file(base | {key: wrong}, path)
            except ConfigError as err:
                assert len(str(err)) <= MESSAGE_LIMIT + len("... (1,000,000 characters)"), (key, wrong)
            finally:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            assert peak < ALLOCATION_LIMIT, (key, repr(wrong)[:20], peak)


def test_deepseek_v3_shared_experts_must_be_a_count():
    path = Path(__file__).parent / "fixtures" / "hf" / "deepseek-v3.json"
    for wrong in ("1", [1], -1, 1.0):
        with pytest.raises(ConfigError, match=r"n_shared_experts must be a non-negative integer, got "):
            spec_from_config_file(json.loads(path.read_text()) | {"n_shared_experts": wrong}, path)


def test_an_integer_of_thousands_of_digits_is_an_input_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}")
    message = f"{path}: holds an integer of thousands of digits, which no model size is"
    with pytest.raises(ConfigError, match=f"^{message}$"):
        read_hf_config(path)
    with pytest.raises(ConfigError, match=f"^{message}$"):  # the dashboard's upload
        parse_hf_config(path.read_bytes(), path)
    with pytest.raises(ConfigError, match=r": not UTF-8 text, as a config.json is$"):
        parse_hf_config(b'{"model_type": "\xff"}', path)


def test_a_config_error_message_is_bounded():
    err = ConfigError("got " + "x" * 5000)
    assert str(err) == "got " + "x" * (MESSAGE_LIMIT - 4) + "... (5,004 characters)"
    assert str(ConfigError("short")) == "short"
