"""Long timelines reduced to a bounded number of points for plots, keeping
peaks: a series of N samples becomes at most `max_points` buckets of equal
width, each with its minimum, maximum and total, so a one-interval spike
survives as a bucket's maximum however long the run (a plain average or
every-k-th sample would lose it).

Also the run's timeline as dense per-interval series, and the training
phases coarsened to a bounded number of shaded bands. Pure: records in,
plain data out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..model.attribution import PHASES
from ..model.run import TraceRun
from ..model.timeline import as_timeline

DATA_OPS = ("read", "write")


@dataclass(frozen=True)
class Envelope:
    """A series in buckets of `bucket` consecutive samples (the last bucket
    may be shorter). Bucket i starts at sample i * bucket."""

    bucket: int                     # samples per bucket; 1: nothing was reduced
    low: tuple[float, ...]
    high: tuple[float, ...]
    total: tuple[float, ...]
    samples: int                    # length of the series reduced

    def mean(self) -> tuple[float, ...]:
        """Mean of each bucket (the last one over its own length)."""
        n = len(self.total)
        return tuple(t / (self.bucket if i < n - 1 else self.samples - i * self.bucket)
                     for i, t in enumerate(self.total))


def envelope(values: Sequence[float], max_points: int) -> Envelope:
    """`values` in at most `max_points` buckets with their min, max and sum."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    n = len(values)
    bucket = max(1, -(-n // max_points))
    if bucket == 1:
        vals = tuple(float(v) for v in values)
        return Envelope(1, vals, vals, vals, n)
    low, high, total = [], [], []
    for i in range(0, n, bucket):
        chunk = values[i:i + bucket]
        low.append(float(min(chunk)))
        high.append(float(max(chunk)))
        total.append(float(sum(chunk)))
    return Envelope(bucket, tuple(low), tuple(high), tuple(total), n)


@dataclass(frozen=True)
class IntervalSeries:
    """One (device, op) of the timeline, one sample per interval from t = 0."""

    device: str
    op: str
    bytes: list[int]
    requests: list[int]


def interval_series(run: TraceRun, ops: tuple[str, ...] = DATA_OPS) -> list[IntervalSeries]:
    """Dense per-interval bytes and requests for each (device, op) in `ops`
    that the timeline holds, sorted by device then op; every series has the
    same length (up to the last interval with any of these ops). Vectorised
    over the timeline's columns: a day at 1 s on 8 devices is 1.4 million
    points."""
    tl = as_timeline(run.timeline)
    if not len(tl):
        return []
    per_s = 1.0 / run.interval_s if run.interval_s > 0 else 1.0
    slot = (tl.t_s * per_s + 0.5).astype(np.int64)
    size = int(slot.max()) + 1
    out, last = [], -1
    for di, device in enumerate(tl.devices):
        on_device = tl.device_code == di
        for oi, op in enumerate(tl.ops):
            if op not in ops:
                continue
            rows = on_device & (tl.op_code == oi)
            if not rows.any():
                continue
            where = slot[rows]
            last = max(last, int(where.max()))
            # float weights are exact here: per-interval sums stay far below 2**53
            out.append((device, op, np.bincount(where, weights=tl.bytes[rows], minlength=size),
                        np.bincount(where, weights=tl.requests[rows], minlength=size)))
    return sorted((IntervalSeries(device, op, b[:last + 1].astype(np.int64).tolist(),
                                  r[:last + 1].astype(np.int64).tolist()) for device, op, b, r in out),
                  key=lambda s: (s.device, s.op))


@dataclass(frozen=True)
class Band:
    phase: str
    t0_s: float        # seconds on the run's timeline (t = 0 at clock_origin_ns)
    t1_s: float


@dataclass(frozen=True)
class PhaseBands:
    bands: tuple[Band, ...]
    slot_s: float | None = None     # None: every phase call as recorded; else each slot's dominant phase


def phase_bands(run: TraceRun, max_bands: int = 400) -> PhaseBands:
    """The lowest rank's training phases as time bands. At most `max_bands`
    calls are kept as they are; beyond that the run is cut into `max_bands`
    slots, each shaded with the phase that took most of it (slots where no
    phase ran stay clear), and equal neighbours merged."""
    att = run.attribution
    if att is None or not att.phases:
        return PhaseBands(())
    rank = min(p.rank for p in att.phases)
    origin = run.clock_origin_ns
    spans = sorted(((p.t0_ns - origin) / 1e9, (p.t1_ns - origin) / 1e9, p.phase)
                   for p in att.phases if p.rank == rank and p.phase in PHASES)
    if len(spans) <= max_bands:
        return PhaseBands(tuple(Band(ph, a, b) for a, b, ph in spans))
    start, end = spans[0][0], max(b for _, b, _ in spans)
    slot = (end - start) / max_bands or 1e-9
    share: list[dict[str, float]] = [{} for _ in range(max_bands)]
    for a, b, ph in spans:
        first, last = int((a - start) / slot), min(int((b - start) / slot), max_bands - 1)
        for k in range(first, last + 1):
            lo, hi = start + k * slot, start + (k + 1) * slot
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                share[k][ph] = share[k].get(ph, 0.0) + overlap
    bands: list[Band] = []
    for k, s in enumerate(share):
        if not s:
            continue
        ph = max(s, key=lambda name: s[name])
        t0 = start + k * slot
        if bands and bands[-1].phase == ph and abs(bands[-1].t1_s - t0) < slot / 2:
            bands[-1] = Band(ph, bands[-1].t0_s, t0 + slot)
        else:
            bands.append(Band(ph, t0, t0 + slot))
    return PhaseBands(tuple(bands), slot)
