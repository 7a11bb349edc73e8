"""How the traced devices were used over time: when they were busy, the
bandwidth while busy (not averaged over idle time), what the job kept in
flight, and how far that is from the device's ceiling."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..model import units
from ..model.run import DeviceStats, TraceRun
from ..model.timeline import as_timeline
from ..model.verdict import DeviceCeiling, Finding, VerdictInputs
from .summary import DATA_OPS, dominant_size

BRIDGE_S = 0.15          # gaps in I/O up to this long count as busy (drives and throttles release in bursts)
CEILING_HINT = "run `iotune report RUN --ceiling` or `iotune sweep --path …` on it"

Span = tuple[float, float]


@dataclass(frozen=True)
class TimelineIndex:
    """The timeline grouped once per (device, op): the sorted starts of the
    intervals that moved bytes, and the bytes moved. A day-long trace has
    over a million points; every busy-time and byte question below is
    answered from this index, built in one vectorised pass over the columns."""

    starts: dict[tuple[str, str], npt.NDArray[np.float64]]
    moved: dict[tuple[str, str], int]


_last_index: tuple[object, TimelineIndex] | None = None


def timeline_index(run: TraceRun) -> TimelineIndex:
    """`run`'s index, built on first use and kept for the last timeline seen
    (a verdict asks several questions of the same run)."""
    global _last_index
    if _last_index is not None and _last_index[0] is run.timeline:
        return _last_index[1]
    tl = as_timeline(run.timeline)
    starts: dict[tuple[str, str], npt.NDArray[np.float64]] = {}
    moved: dict[tuple[str, str], int] = {}
    n_ops = max(len(tl.ops), 1)
    key = tl.device_code.astype(np.int64) * n_ops + tl.op_code      # one code per (device, op)
    busy = tl.bytes > 0
    for k in np.unique(key[busy]).tolist():
        rows = busy & (key == k)
        name = (tl.devices[k // n_ops], tl.ops[k % n_ops])
        starts[name] = np.unique(tl.t_s[rows])
        moved[name] = int(tl.bytes[rows].sum())
    index = TimelineIndex(starts, moved)
    _last_index = (run.timeline, index)
    return index


def busy_spans(run: TraceRun, devices: Iterable[str] | None = None, ops: Iterable[str] = DATA_OPS,
               bridge_s: float = 0.0) -> list[Span]:
    """[start, end) seconds during which `devices` (default: the top-level
    ones) issued bytes of `ops`: each timeline interval with bytes, merged
    with its neighbours when the gap between them is at most `bridge_s`."""
    names = set(devices) if devices is not None else {d.name for d in run.devices if not d.is_lower}
    wanted = set(ops)
    chosen = [s for (dev, op), s in timeline_index(run).starts.items() if dev in names and op in wanted]
    if not chosen:
        return []
    starts = np.unique(np.concatenate(chosen)) if len(chosen) > 1 else chosen[0]
    ends = starts + run.interval_s           # every interval is as long: ends are sorted too
    breaks = starts[1:] - ends[:-1] > bridge_s + 1e-9
    firsts = starts[np.concatenate(([True], breaks))]
    lasts = ends[np.concatenate((breaks, [True]))]
    return list(zip(firsts.tolist(), lasts.tolist()))


def overlap(spans: list[Span], lo: float, hi: float) -> float:
    """Seconds of [lo, hi) covered by `spans` (sorted, disjoint)."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans if a < hi and b > lo)


def length(spans: list[Span]) -> float:
    return sum(b - a for a, b in spans)


@dataclass(frozen=True)
class DeviceUse:
    """One device over the whole run."""

    device: str
    bytes: int                      # read + write, from the timeline
    busy_s: float
    read_bytes_per_s: float | None  # while busy with reads
    write_bytes_per_s: float | None

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.busy_s if self.busy_s > 0 else 0.0


def device_use(run: TraceRun, device: str, bridge_s: float) -> DeviceUse:
    index = timeline_index(run)
    moved = {op: index.moved.get((device, op), 0) for op in DATA_OPS}

    def rate(op: str) -> float | None:
        busy = length(busy_spans(run, [device], [op], bridge_s))
        return moved[op] / busy if busy > 0 and moved[op] else None

    return DeviceUse(device, sum(moved.values()), length(busy_spans(run, [device], DATA_OPS, bridge_s)),
                     rate("read"), rate("write"))


def ceiling_of(inputs: VerdictInputs, device: str) -> DeviceCeiling | None:
    return next((c for c in inputs.ceilings if c.device == device and c.bytes_per_s > 0), None)


def busiest(run: TraceRun) -> DeviceStats | None:
    top = [d for d in run.devices if not d.is_lower]
    moved = {d.name: sum(d.direction(op).bytes for op in DATA_OPS) for d in top}
    best = max(top, key=lambda d: (moved[d.name], d.name), default=None)
    return best if best is not None and moved[best.name] > 0 else None


def distance_findings(run: TraceRun, inputs: VerdictInputs, bridge_s: float) -> list[Finding]:
    """One finding per top-level device that moved data: its bandwidth while
    busy against its ceiling."""
    out = []
    for dev in run.devices:
        if dev.is_lower:
            continue
        use = device_use(run, dev.name, bridge_s)
        if use.bytes > 0 and use.busy_s > 0:
            out.append(_distance(run, use, ceiling_of(inputs, dev.name), bridge_s))
    if not out:
        traced = ", ".join(d.name for d in run.devices if not d.is_lower) or "none"
        out.append(Finding("distance", f"The traced devices ({traced}) moved no data.",
                           "bytes read and written on the traced top-level devices", {"bytes": 0}))
    return out


def _distance(run: TraceRun, use: DeviceUse, ceiling: DeviceCeiling | None, bridge_s: float) -> Finding:
    dirs = ", ".join(f"{op} {units.mb_s(rate)}" for op, rate in (("read", use.read_bytes_per_s),
                                                                     ("write", use.write_bytes_per_s)) if rate)
    head = (f"{use.device} moved {units.mb_s(use.bytes_per_s)} while busy ({dirs}; busy {use.busy_s:.2f} s "
            f"of the {run.duration_s:.2f} s run)")
    figures: dict[str, float | int | str | None] = {
        "device": use.device, "bytes": use.bytes, "busy_s": use.busy_s, "bytes_per_s_busy": use.bytes_per_s,
        "read_bytes_per_s_busy": use.read_bytes_per_s, "write_bytes_per_s_busy": use.write_bytes_per_s,
        "ceiling_bytes_per_s": None, "ceiling_source": None, "share_of_ceiling": None}
    rule = (f"bandwidth while busy = bytes read and written / busy time (timeline intervals with I/O, gaps up to "
            f"{bridge_s:g} s included), not averaged over idle time")
    if ceiling is None:
        head += f"; its ceiling is unknown — {CEILING_HINT}."
    else:
        share = use.bytes_per_s / ceiling.bytes_per_s
        head += (f": {share:.0%} of its {units.mb_s(ceiling.bytes_per_s)} ceiling "
                 f"({ceiling.source}).")
        rule += "; ceiling: read and write bandwidth's harmonic mean where the source measured both"
        figures.update(ceiling_bytes_per_s=ceiling.bytes_per_s, ceiling_source=ceiling.source,
                       share_of_ceiling=share)
    return Finding("distance", head, rule, figures)


@dataclass(frozen=True)
class InFlight:
    """What the job kept in flight on one device (from its histograms)."""

    device: str
    request_bytes: int          # the dominant request size
    mean_depth: float           # requests in flight at issue, mean over reads and writes
    mean_lat_s: float | None    # issue -> complete

    @property
    def bytes(self) -> float:
        return self.request_bytes * self.mean_depth


def in_flight(dev: DeviceStats) -> InFlight | None:
    size = dominant_size(dev)
    depth_n = sum(n for op in DATA_OPS for n in dev.direction(op).depth.values())
    if not size or not depth_n:
        return None
    depth = sum(k * n for op in DATA_OPS for k, n in dev.direction(op).depth.items()) / depth_n
    done = sum(dev.direction(op).completed for op in DATA_OPS)
    lat = sum(dev.direction(op).lat_sum_ns for op in DATA_OPS) / done / 1e9 if done else None
    return InFlight(dev.name, size, depth, lat)
