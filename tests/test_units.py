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


def test_a_unit_that_reads_as_bits_is_refused_and_bytes_in_lower_case_are_read():
    """"80Gb" is gigabits as a network's rate is written: a memory size in it would be 10 GB, so it is refused;
    "80gb", written in lower case throughout, is taken for bytes."""
    with pytest.raises(ConfigError, match=r"^unit 'Gb' in '80Gb' reads as gigabits; a memory size is in bytes: use GB "
                                          r"\(powers of 1000\) or GiB \(powers of 1024\)$"):
        parse_bytes("80Gb")
    assert parse_bytes("80gb") == parse_bytes("80GB") == 80 * GB
