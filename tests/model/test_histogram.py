from __future__ import annotations

import re
from pathlib import Path

import pytest

from iotune.model import histogram as h
from iotune.model.run import OPS

PROBES = Path(__file__).resolve().parents[2] / "probes"


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


def header_defines(prefix: str) -> dict[str, int]:
    text = (PROBES / "blockio.h").read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(rf"#define {prefix}(\w+)\s+(\d+)\b", text)}


def test_probe_header_matches_python_layout() -> None:
    """probes/blockio.h, iotune/model and iotune/trace/probe.py agree on op
    numbering, slots, row sizes and drop counters."""
    from iotune.trace import probe

    ops = {k.lower(): v for k, v in header_defines("OP_").items()}
    assert [op for op, _ in sorted(ops.items(), key=lambda kv: kv[1])] == list(OPS)
    consts = header_defines("")
    assert consts["LAT_SUB_BITS"] == h.LAT_SUB_BITS and consts["NOPS"] == probe.NOPS == len(OPS)
    assert (consts["LAT_SLOTS"], consts["DEPTH_SLOTS"]) == (probe.LAT_SLOTS, probe.DEPTH_SLOTS)
    assert (consts["SIZE_SLOTS"], consts["SIZE_UNIT"]) == (probe.SIZE_SLOTS, probe.SIZE_UNIT)
    drops = {k.lower(): v for k, v in header_defines("DROP_").items() if k != "SLOTS"}
    assert [d for d, _ in sorted(drops.items(), key=lambda kv: kv[1])] == list(probe.DROP_NAMES)
    assert header_defines("DROP_")["SLOTS"] == len(probe.DROP_NAMES)


def test_latency_rows_hold_everything_under_2_to_the_35_ns() -> None:
    """Latencies below 2**35 ns (34 s) fit the per-CPU row; longer ones go to
    the overflow map, so none is lost."""
    from iotune.trace.probe import LAT_SLOTS

    assert h.lat_slot(2**35 - 1) == LAT_SLOTS - 1 and h.lat_slot(2**35) == LAT_SLOTS
