from __future__ import annotations

import re
from pathlib import Path

import pytest

from iotune.model import histogram as h
from iotune.model.run import OPS

PROBES = Path(__file__).resolve().parents[1] / "probes"


@pytest.mark.parametrize("value", [0, 1, 7, 8, 9, 15, 16, 17, 100, 1023, 1024, 4095, 123_456, 10**9, 2**40 + 5])
def test_lat_slot_bounds_contain_the_value(value: int) -> None:
    lo, hi = h.lat_slot_bounds(h.lat_slot(value))
    assert lo <= value < hi


def test_lat_slot_width_is_at_most_an_eighth_of_its_lower_bound() -> None:
    for slot in range(8, 300):
        lo, hi = h.lat_slot_bounds(slot)
        assert (hi - lo) * 8 <= lo
        assert h.lat_slot(lo) == slot and h.lat_slot(hi - 1) == slot


def test_lat_slots_are_contiguous() -> None:
    for slot in range(0, 300):
        assert h.lat_slot_bounds(slot)[1] == h.lat_slot_bounds(slot + 1)[0]


def test_size_slots_match_bcc_log2() -> None:
    assert h.size_slot(0) == 0
    assert h.size_slot(1) == 1
    assert h.size_slot(4096) == 13 and h.size_slot_bounds(13) == (4096, 8192)
    assert h.size_slot(524288) == 20 and h.size_slot_bounds(20) == (524288, 1048576)
    assert h.size_slot(524287) == 19


def test_percentile_is_upper_bound_of_the_slot() -> None:
    slots = {h.lat_slot(1000): 50, h.lat_slot(100_000): 49, h.lat_slot(5_000_000): 1}
    assert h.percentile_ns(slots, 0.5) == h.lat_slot_bounds(h.lat_slot(1000))[1]
    assert h.percentile_ns(slots, 0.99) == h.lat_slot_bounds(h.lat_slot(100_000))[1]
    assert h.percentile_ns(slots, 1.0) == h.lat_slot_bounds(h.lat_slot(5_000_000))[1]
    assert h.percentile_ns({}, 0.5) is None


def test_log2_from_sizes() -> None:
    assert h.log2_from_sizes({4096: 29, 524288: 23, 6000: 1}) == {13: 30, 20: 23}


def test_probe_header_matches_python_layout() -> None:
    """probes/blockio.h and iotune/model agree on op numbering and slots."""
    text = (PROBES / "blockio.h").read_text()
    ops = {m.group(1).lower(): int(m.group(2)) for m in re.finditer(r"#define OP_(\w+)\s+(\d+)", text)}
    assert [op for op, _ in sorted(ops.items(), key=lambda kv: kv[1])] == list(OPS)
    assert int(re.search(r"#define LAT_SUB_BITS (\d+)", text).group(1)) == h.LAT_SUB_BITS
