"""Hand-built trace records for the pure-layer tests."""

from __future__ import annotations

from iotune.model.histogram import lat_slot, log2_from_sizes
from iotune.model.run import DeviceStats, DirectionStats, HostInfo, TimelinePoint, TraceRun

KiB = 1024


def direction(op: str, sizes: dict[int, int], lat_ns: int = 100_000, depth: int = 4,
              sequential: int = 0, meta: int = 0) -> DirectionStats:
    n = sum(sizes.values())
    return DirectionStats(
        op=op, requests=n, bytes=sum(s * c for s, c in sizes.items()), sequential=sequential,
        meta=meta, completed=n, lat_sum_ns=n * lat_ns, sizes=dict(sizes),
        size_log2=log2_from_sizes(sizes), lat_slots={lat_slot(lat_ns): n}, depth={depth: n},
    )


def offload_run() -> TraceRun:
    """An optimizer-swap-like run on loop0 over vda: 23 reads and 29 writes of
    512 KiB plus small metadata writes; vda carries loop0's I/O again."""
    loop0 = DeviceStats(
        major=7, minor=0, name="loop0", description="loop over /scratch/drive.img on vda",
        directions={
            "read": direction("read", {512 * KiB: 23}, lat_ns=2_000_000, sequential=22),
            "write": direction("write", {512 * KiB: 29, 4 * KiB: 3}, lat_ns=3_000_000, sequential=28, meta=3),
        },
    )
    vda = DeviceStats(
        major=254, minor=0, name="vda", lower_of=("loop0",),
        directions={"write": direction("write", {1024 * KiB: 14, 512 * KiB: 1, 4 * KiB: 3})},
    )
    timeline = (
        TimelinePoint(0.0, "loop0", "write", 32, 29 * 512 * KiB + 3 * 4 * KiB),
        TimelinePoint(1.0, "loop0", "read", 23, 23 * 512 * KiB),
    )
    return TraceRun(
        run_id="abc123def456", started_at="2026-11-21T22:00:00+00:00", duration_s=2.0,
        command=("fio", "job.fio"), exit_status=0, outcome="completed", device_filter=(),
        devices=(loop0, vda), timeline=timeline, drops={"sizes": 0, "start": 0, "timeline": 0, "other": 0},
        host=HostInfo(kernel="6.18.44", hostname="test", iotune_version="0.1.0"),
    )
