import pytest

from headroom.core.errors import ConfigError
from headroom.core.units import GB, GiB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80 * 10**9),
        ("80 GiB", 80 * 2**30),
        ("81920MiB", 80 * 2**30),
        ("1.5e9", 1_500_000_000),
        ("512", 512),
        ("0.5TB", 500 * 10**9),
        (4096, 4096),
    ],
)
def test_parse_bytes_accepts_both_unit_families(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["eighty", "80XB", "-5GB", "0GB", ""])
def test_parse_bytes_rejects_bad_sizes_with_the_value_named(text):
    with pytest.raises(ConfigError, match="size|unit"):
        parse_bytes(text)


def test_gb_and_gib_differ():
    assert GiB / GB == pytest.approx(1.073741824)
    assert format_bytes(80 * 10**9, "GiB") == "74.51 GiB"
    assert format_bytes(80 * 10**9, "GB") == "80.00 GB"
