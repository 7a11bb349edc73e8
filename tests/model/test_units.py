from __future__ import annotations

from collections.abc import Callable

import pytest

from iotune.model import units
from iotune.model.units import parse_count, parse_rate, parse_size


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


@pytest.mark.parametrize("text,expected", [
    ("16B", 16_000_000_000), ("16b", 16_000_000_000), ("1.5B", 1_500_000_000), ("350M", 350_000_000),
    ("7e9", 7_000_000_000), ("1.5e9", 1_500_000_000), ("8000000000", 8_000_000_000), ("125k", 125_000),
    ("2T", 2_000_000_000_000), (" 70B ", 70_000_000_000), ("0.5B", 500_000_000),
])
def test_parse_count_takes_model_sizes(text: str, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize("text,message", [
    ("16GB", "is not a parameter count: write it as 16B, 1.5B, 350M, 7e9 or 8000000000"),
    ("16G", "is not a parameter count"), ("abc", "is not a parameter count"), ("-3B", "is not a parameter count"),
    ("", "is not a parameter count"), ("1.5", "is not a whole number of parameters"),
    ("0", "give a parameter count above 0"), ("0B", "give a parameter count above 0"),
])
def test_parse_count_rejects_with_the_forms_it_takes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_count(text)


def test_parse_rate() -> None:
    assert parse_rate("200MB/s") == 2e8
    assert parse_rate("2GiB/s") == 2 * (1 << 30)
    assert parse_rate("200MB") == 2e8
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate("fast")


@pytest.mark.parametrize("n,expected", [
    (524288, "512 KiB"), (1536, "1.5 KiB"), (4096, "4 KiB"), (1 << 20, "1 MiB"), (8 << 20, "8 MiB"),
    (3 << 29, "1.5 GiB"), (1023, "1023 B"), (0, "0 B"),
])
def test_size_is_binary_and_whole_when_exact(n: int, expected: str) -> None:
    assert units.size(n) == expected


@pytest.mark.parametrize("n,expected", [(524288, "512K"), (1 << 20, "1M"), (3 << 29, "1.5G"), (512, "512")])
def test_short_size(n: int, expected: str) -> None:
    assert units.short_size(n) == expected


@pytest.mark.parametrize("n,expected", [
    (10 << 20, "10.0 MiB"), (116_000_000, "110.6 MiB"), (0, "0.0 MiB"), (1023 << 20, "1,023.0 MiB"),
    (1 << 30, "1.00 GiB"), (3 << 30, "3.00 GiB"), (2048 << 30, "2,048.00 GiB"),
])
def test_mib_switches_to_gib_at_one_gib(n: int, expected: str) -> None:
    assert units.mib(n) == expected


@pytest.mark.parametrize("n,expected", [
    (12_058_624, "12.06 MB"), (2_500_000_000, "2.50 GB"), (24e12, "24.00 TB"), (1500, "1.50 kB"), (512, "512 B"),
    (2e15, "2,000.00 TB"),
])
def test_volume_is_decimal(n: float, expected: str) -> None:
    assert units.volume(n) == expected


def test_bare_decimal_numbers_and_rates() -> None:
    assert units.mb(12_345_678) == "12.3"
    assert units.mb(2.5e9) == "2,500.0"
    assert units.rate(200_000_000) == "200.0"
    assert units.mb_s(62_300_000) == "62.3 MB/s"
    assert units.mb_s(1.5e9) == "1,500.0 MB/s"
    assert units.gb(480_000_000) == "0.480"
    assert units.gb(0) == "0.000"
    assert units.gb(1.2345e12) == "1,234.500"


@pytest.mark.parametrize("formatter", [units.mb, units.rate, units.mb_s, units.gb, units.latency, units.step_time])
def test_a_missing_value_prints_a_dash(formatter: Callable[[None], str]) -> None:
    assert formatter(None) == "-"


def test_times_and_counts() -> None:
    assert units.latency(1500) == "2 µs"
    assert units.latency(2_500_000) == "2.50 ms"
    assert units.latency(3e9) == "3.00 s"
    assert units.latency(800) == "800 ns"
    assert units.seconds(2) == "2.00 s"
    assert units.seconds(150) == "2.5 min"
    assert units.step_time(0.4) == "0.400 s"
    assert units.count(12_345.6) == "12,346"
