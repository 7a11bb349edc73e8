"""Per-device and per-direction summaries of a TraceRun, and the I/O-pattern
table of Xinnor's published offload benchmark (requests at the AIO block size vs
other sizes)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.histogram import percentile_ns
from ..model.run import DeviceStats, DirectionStats, TraceRun

DATA_OPS = ("read", "write")


@dataclass(frozen=True)
class DirectionSummary:
    device: str
    op: str
    requests: int
    bytes: int
    iops: float
    bytes_per_s: float
    avg_size_bytes: float
    p50_lat_ns: int | None
    p99_lat_ns: int | None
    mean_lat_ns: float | None
    mean_depth: float | None
    max_depth: int
    sequential_pct: float | None
    meta: int
    errors: int
    lower: bool
    queued: int = 0                      # requests that waited in the I/O scheduler's queue
    p50_queue_ns: int | None = None      # their insert -> issue time
    p99_queue_ns: int | None = None


def summarize_direction(dev: DeviceStats, s: DirectionStats, duration_s: float) -> DirectionSummary:
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    depth_n = sum(s.depth.values())
    return DirectionSummary(
        device=dev.name, op=s.op, requests=s.requests, bytes=s.bytes,
        iops=s.requests * per_s, bytes_per_s=s.bytes * per_s,
        avg_size_bytes=s.bytes / s.requests if s.requests else 0.0,
        p50_lat_ns=percentile_ns(s.lat_slots, 0.50),
        p99_lat_ns=percentile_ns(s.lat_slots, 0.99),
        mean_lat_ns=s.lat_sum_ns / s.completed if s.completed else None,
        mean_depth=sum(k * v for k, v in s.depth.items()) / depth_n if depth_n else None,
        max_depth=max(s.depth, default=0),
        sequential_pct=100.0 * s.sequential / s.requests if s.requests else None,
        meta=s.meta, errors=s.errors, lower=dev.is_lower,
        queued=s.queued, p50_queue_ns=percentile_ns(s.queue_slots, 0.50),
        p99_queue_ns=percentile_ns(s.queue_slots, 0.99),
    )


def summarize(run: TraceRun) -> list[DirectionSummary]:
    """One row per (device, direction) that saw requests, devices in name order."""
    return [
        summarize_direction(dev, s, run.duration_s)
        for dev in run.devices
        for s in sorted(dev.directions.values(), key=lambda s: _op_order(s.op))
        if s.requests
    ]


def _op_order(op: str) -> int:
    order = ("read", "write", "flush", "discard", "other")
    return order.index(op) if op in order else len(order)


@dataclass(frozen=True)
class Totals:
    """Sums over top-level devices only: a device that carries another traced
    device's I/O again (lower_of) is not added, so nothing counts twice."""

    read_requests: int
    read_bytes: int
    write_requests: int
    write_bytes: int
    devices: tuple[str, ...]
    excluded: tuple[str, ...]


def totals(run: TraceRun) -> Totals:
    top = [d for d in run.devices if not d.is_lower]
    return Totals(
        read_requests=sum(d.direction("read").requests for d in top),
        read_bytes=sum(d.direction("read").bytes for d in top),
        write_requests=sum(d.direction("write").requests for d in top),
        write_bytes=sum(d.direction("write").bytes for d in top),
        devices=tuple(d.name for d in top),
        excluded=tuple(d.name for d in run.devices if d.is_lower),
    )


def top_sizes(s: DirectionStats, n: int = 5) -> list[tuple[int, int]]:
    """The n most frequent exact sizes: (size_bytes, count), most frequent first."""
    return sorted(s.sizes.items(), key=lambda kv: (-kv[1], -kv[0]))[:n]


def dominant_size(dev: DeviceStats) -> int | None:
    """The request size that moved the most bytes in reads and writes."""
    by_bytes: dict[int, int] = {}
    for op in DATA_OPS:
        for size, count in dev.direction(op).sizes.items():
            by_bytes[size] = by_bytes.get(size, 0) + size * count
    return max(by_bytes, key=lambda k: (by_bytes[k], k)) if by_bytes else None


@dataclass(frozen=True)
class PatternRow:
    """The I/O-pattern table of Xinnor's published offload benchmark, for one device."""

    device: str
    block_size_bytes: int
    read_at_block: int
    write_at_block: int
    read_other: int
    write_other: int
    read_at_block_bytes: int
    write_at_block_bytes: int
    read_other_bytes: int
    write_other_bytes: int


def pattern(dev: DeviceStats, block_size_bytes: int) -> PatternRow:
    counts: dict[str, tuple[int, int, int, int]] = {}
    for op in DATA_OPS:
        s = dev.direction(op)
        at = s.sizes.get(block_size_bytes, 0)
        counts[op] = (at, s.requests - at, at * block_size_bytes, s.bytes - at * block_size_bytes)
    r, w = counts["read"], counts["write"]
    return PatternRow(dev.name, block_size_bytes, r[0], w[0], r[1], w[1], r[2], w[2], r[3], w[3])


def patterns(run: TraceRun, block_size_bytes: int | None = None) -> list[PatternRow]:
    """One row per device with reads or writes; the block size is the one given
    or, per device, its dominant request size."""
    rows = []
    for dev in run.devices:
        bs = block_size_bytes or dominant_size(dev)
        if bs:
            rows.append(pattern(dev, bs))
    return rows
