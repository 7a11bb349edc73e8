"""How the traced devices were used over time: when they were busy, the
bandwidth while busy (not averaged over idle time), what the job kept in
flight, and how far that is from the device's ceiling.

The bandwidth compared with a ceiling is the steady steps' (rate_steps: never
the first step, which creates Adam's moments and writes twice what it reads)
when the run has training steps, else the whole run's. Its share of the
ceiling is never shown above 1: a run measured faster than a job-pattern
ceiling's top is a measurement to redo (a note says so, with
check_against_ceiling's text), and one faster than a ceiling measured with
another pattern (fio's) shows that ceiling is no bound for this job."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..model import units
from ..model.replay_result import check_against_ceiling, fraction_of_ceiling
from ..model.run import DeviceStats, TraceRun
from ..model.timeline import as_timeline
from ..model.verdict import DeviceCeiling, Finding, VerdictInputs
from .attribution import StepBreakdown, rate_steps, step_breakdowns
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


@dataclass(frozen=True)
class SteadyUse:
    """One device over the steps compared with its ceiling (rate_steps):
    each step's bytes over its busy time, the median over the steps. The
    median, not the pooled bytes over the pooled time: in a step the job
    stalled in (a CPU hiccup on a shared host), a drive that rations
    bandwidth (a blkio throttle) lets the backlog through in a burst faster
    than it sustains, and such a step does not carry the figure."""

    steps: tuple[int, ...]
    bytes_per_s: float
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None


def steady_use(run: TraceRun, device: str, bridge_s: float,
               rows: list[StepBreakdown] | None = None) -> SteadyUse | None:
    """`device`'s bandwidth while busy in each of the run's rate_steps (each
    step's period: from its first phase to the next step's), the median over
    them; None when the run has no such step or the device was not busy in any."""
    chosen = [r for r in rate_steps(step_breakdowns(run) if rows is None else rows) if r.t1_ns > r.t0_ns]
    origin = run.clock_origin_ns
    windows = [((r.t0_ns - origin) / 1e9, (r.t1_ns - origin) / 1e9) for r in chosen]
    moved = {op: _bytes_in(run, device, op, windows) for op in DATA_OPS}
    busy = {op: [overlap(busy_spans(run, [device], [op], bridge_s), lo, hi) for lo, hi in windows] for op in DATA_OPS}
    total_busy = [overlap(busy_spans(run, [device], DATA_OPS, bridge_s), lo, hi) for lo, hi in windows]

    def median_rate(nbytes: list[int], seconds: list[float]) -> float | None:
        rates = [b / t for b, t in zip(nbytes, seconds) if b and t > 0]
        return float(statistics.median(rates)) if rates else None

    total = median_rate([sum(moved[op][i] for op in DATA_OPS) for i in range(len(windows))], total_busy)
    if total is None:
        return None
    return SteadyUse(tuple(r.step for r in chosen), total, median_rate(moved["read"], busy["read"]),
                     median_rate(moved["write"], busy["write"]))


def _bytes_in(run: TraceRun, device: str, op: str, windows: list[Span]) -> list[int]:
    """Bytes of `op` on `device` in the timeline intervals starting inside each of `windows`."""
    tl = as_timeline(run.timeline)
    if device not in tl.devices or op not in tl.ops:
        return [0] * len(windows)
    mine = (tl.device_code == tl.devices.index(device)) & (tl.op_code == tl.ops.index(op))
    order = np.argsort(tl.t_s[mine], kind="stable")
    starts, cum = tl.t_s[mine][order], np.concatenate(([0], np.cumsum(tl.bytes[mine][order])))
    return [int(cum[np.searchsorted(starts, hi, "left")] - cum[np.searchsorted(starts, lo, "left")])
            for lo, hi in windows]


def ceiling_of(inputs: VerdictInputs, device: str) -> DeviceCeiling | None:
    """The device's ceiling; a job-pattern one before any other."""
    found = [c for c in inputs.ceilings if c.device == device and c.bytes_per_s > 0]
    return next((c for c in found if c.job is not None), found[0] if found else None)


def share_of_ceiling(bytes_per_s: float, ceiling: DeviceCeiling) -> float:
    """bytes_per_s / the ceiling, never above 1 (fraction_of_ceiling for a job-pattern one)."""
    if ceiling.job is not None:
        return fraction_of_ceiling(bytes_per_s, ceiling.job)
    return min(1.0, max(0.0, bytes_per_s / ceiling.bytes_per_s)) if ceiling.bytes_per_s > 0 else 0.0


def above_ceiling(bytes_per_s: float, ceiling: DeviceCeiling) -> bool:
    """Measured faster than the fastest the ceiling measured (a job-pattern ceiling's top)."""
    return bytes_per_s > ceiling.top_bytes_per_s


def busiest(run: TraceRun) -> DeviceStats | None:
    top = [d for d in run.devices if not d.is_lower]
    moved = {d.name: sum(d.direction(op).bytes for op in DATA_OPS) for d in top}
    best = max(top, key=lambda d: (moved[d.name], d.name), default=None)
    return best if best is not None and moved[best.name] > 0 else None


def distance_findings(run: TraceRun, inputs: VerdictInputs, bridge_s: float,
                      rows: list[StepBreakdown] | None = None) -> list[Finding]:
    """One finding per top-level device that moved data: its bandwidth while
    busy (in the steady steps, when the run has them) against its ceiling;
    and a note for each device measured faster than its job-pattern ceiling."""
    out = []
    rows = step_breakdowns(run) if rows is None else rows
    for dev in run.devices:
        if dev.is_lower:
            continue
        use = device_use(run, dev.name, bridge_s)
        if use.bytes > 0 and use.busy_s > 0:
            out.extend(_distance(run, use, steady_use(run, dev.name, bridge_s, rows), ceiling_of(inputs, dev.name),
                                 bridge_s))
    if not out:
        traced = ", ".join(d.name for d in run.devices if not d.is_lower) or "none"
        out.append(Finding("distance", f"The traced devices ({traced}) moved no data.",
                           "bytes read and written on the traced top-level devices", {"bytes": 0}))
    return out


def _distance(run: TraceRun, use: DeviceUse, steady: SteadyUse | None, ceiling: DeviceCeiling | None,
              bridge_s: float) -> list[Finding]:
    dirs = ", ".join(f"{op} {units.mb_s(rate)}" for op, rate in (("read", use.read_bytes_per_s),
                                                                     ("write", use.write_bytes_per_s)) if rate)
    head = (f"{use.device} moved {units.mb_s(use.bytes_per_s)} while busy ({dirs}; busy {use.busy_s:.2f} s "
            f"of the {run.duration_s:.2f} s run)")
    compared = steady.bytes_per_s if steady is not None else use.bytes_per_s
    if steady is not None:
        head += f"; {units.mb_s(compared)} in the median steady step ({_steps(steady.steps)})"
    figures: dict[str, float | int | str | None] = {
        "device": use.device, "bytes": use.bytes, "busy_s": use.busy_s, "bytes_per_s_busy": use.bytes_per_s,
        "read_bytes_per_s_busy": use.read_bytes_per_s, "write_bytes_per_s_busy": use.write_bytes_per_s,
        "steady_steps": len(steady.steps) if steady is not None else None,
        "steady_bytes_per_s_busy": steady.bytes_per_s if steady is not None else None,
        "compared_bytes_per_s": compared,
        "ceiling_bytes_per_s": None, "ceiling_source": None, "ceiling_kind": None, "ceiling_min_bytes_per_s": None,
        "ceiling_max_bytes_per_s": None, "ceiling_runs": None, "share_of_ceiling": None}
    rule = (f"bandwidth while busy = bytes read and written / busy time (timeline intervals with I/O, gaps up to "
            f"{bridge_s:g} s included), not averaged over idle time; compared with the ceiling: the median over the "
            f"steady steps (never the first step) of each step's, else the whole run's")
    if ceiling is None:
        return [Finding("distance", head + f"; its ceiling is unknown — {CEILING_HINT}.", rule, figures)]
    share, job = share_of_ceiling(compared, ceiling), ceiling.job
    figures.update(ceiling_bytes_per_s=ceiling.bytes_per_s, ceiling_source=ceiling.source, ceiling_kind=ceiling.kind,
                   ceiling_min_bytes_per_s=job.min_bytes_per_s if job else None,
                   ceiling_max_bytes_per_s=job.max_bytes_per_s if job else None,
                   ceiling_runs=job.count if job else None, share_of_ceiling=share)
    rule += ("; share of the ceiling shown at most 100%: a job-pattern ceiling (the job's swap I/O replayed "
             "without compute) bounds the job, so a run above its top is re-measured; a ceiling measured with "
             "another pattern (fio's) bounds only that pattern")
    warning = check_against_ceiling(compared, job) if job is not None else None
    if warning is not None:
        head += f": at its {ceiling.label}, and above that ceiling's top: re-measure (see the note)."
    elif above_ceiling(compared, ceiling):
        head += f": faster than its {ceiling.label}, so that ceiling does not bound this job — {_own_ceiling_hint(run)}."
    else:
        head += f": {share:.0%} of its {ceiling.label}."
    found = [Finding("distance", head, rule, figures)]
    if warning is not None:
        found.append(Finding("note", f"{use.device}: {warning}.",
                             "measured bandwidth while busy (steady steps) above the top of the job-pattern "
                             "ceiling's spread", {"device": use.device, "measured_bytes_per_s": compared,
                                                  "ceiling_max_bytes_per_s": job.max_bytes_per_s if job else None}))
    return found


def _own_ceiling_hint(run: TraceRun) -> str:
    if run.swap_schedule is not None:
        return "`iotune report RUN --ceiling` measures the job's own (its swap I/O replayed)"
    return "a run traced by this iotune keeps a steady step's swap I/O for `iotune report RUN --ceiling` to replay"


def _steps(steps: tuple[int, ...]) -> str:
    """"step 2", "steps 1-6", "steps 1, 3, 4"."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if list(steps) == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}–{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


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
