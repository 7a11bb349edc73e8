"""Slot arithmetic for the kernel histograms (mirrors probes/blockio.h).

Size histogram (bcc style): slot 0 holds 0-byte requests (flushes); slot k >= 1
holds sizes in [2**(k-1), 2**k).

Latency histogram (log-linear): values below 8 ns get their own slot; above
that each power of two is split into 8 equal sub-slots, so a slot is at most
1/8 as wide as its lower bound and a percentile read from it is within 12.5%.
"""

from __future__ import annotations

from collections.abc import Mapping

LAT_SUB_BITS = 3
LAT_SUB = 1 << LAT_SUB_BITS


def size_slot(size_bytes: int) -> int:
    """Log2 slot of a request size, as the probe computes it."""
    return size_bytes.bit_length() if size_bytes > 0 else 0


def size_slot_bounds(slot: int) -> tuple[int, int]:
    """[low, high) bytes covered by a size slot."""
    if slot <= 0:
        return (0, 1)
    return (1 << (slot - 1), 1 << slot)


def lat_slot(value_ns: int) -> int:
    """Log-linear slot of a latency in ns, as the probe computes it."""
    if value_ns < LAT_SUB:
        return max(value_ns, 0)
    log = value_ns.bit_length() - 1
    shift = log - LAT_SUB_BITS
    return LAT_SUB + shift * LAT_SUB + ((value_ns >> shift) & (LAT_SUB - 1))


def lat_slot_bounds(slot: int) -> tuple[int, int]:
    """[low, high) ns covered by a latency slot."""
    if slot < LAT_SUB:
        return (slot, slot + 1)
    shift, sub = divmod(slot - LAT_SUB, LAT_SUB)
    low = (LAT_SUB + sub) << shift
    return (low, low + (1 << shift))


def percentile_ns(lat_slots: Mapping[int, int], q: float) -> int | None:
    """Upper bound (ns) of the slot holding the q-quantile (0 < q <= 1).

    None when the histogram is empty.
    """
    total = sum(lat_slots.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for slot in sorted(lat_slots):
        seen += lat_slots[slot]
        if seen >= rank:
            return lat_slot_bounds(slot)[1]
    return lat_slot_bounds(max(lat_slots))[1]


def log2_from_sizes(sizes: Mapping[int, int]) -> dict[int, int]:
    """Size histogram rebuilt from exact size counts."""
    out: dict[int, int] = {}
    for size, count in sizes.items():
        slot = size_slot(size)
        out[slot] = out.get(slot, 0) + count
    return out
