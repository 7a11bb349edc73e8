from __future__ import annotations

import pytest

from iotune.model.units import parse_size
from iotune.render import units


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), ("512K", 524288), ("512k", 524288), ("512KiB", 524288), ("1M", 1 << 20),
    ("1MiB", 1 << 20), ("1MB", 10**6), ("2GB", 2 * 10**9), ("1.5K", 1536), ("16M", 16 << 20),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12Q", "-4K", "0.3"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size|whole number"):
        parse_size(text)


def test_formatting_is_explicit_about_units() -> None:
    assert units.size(524288) == "512 KiB"
    assert units.size(1536) == "1.5 KiB"
    assert units.size(4096) == "4 KiB"
    assert units.volume(12_058_624) == "12.06 MB"
    assert units.volume(2_500_000_000) == "2.50 GB"
    assert units.rate(200_000_000) == "200.0"
    assert units.latency(1500) == "2 µs"
    assert units.latency(2_500_000) == "2.50 ms"
    assert units.latency(None) == "-"
