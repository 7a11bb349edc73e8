"""Joining the job's phases and swap records with the block trace.

Block-level bytes are attributed to a time window (a step, a phase) from the
run's timeline (10 ms intervals when attributing): exactly for the intervals
a window covers, and at its edges by splitting an interval in proportion to
the swap bytes issued on each side of the edge (by time if none were), see
BlockTimeline. Only top-level devices count, as in the totals. Swap-level bytes (what
DeepSpeed's swapper handed to aio, per tensor file) are exact per step,
phase and category.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ..model.attribution import PhaseSpan
from ..model.run import TraceRun

STEP_PHASES = ("forward", "backward", "accumulate", "optimizer")


@dataclass(frozen=True)
class Window:
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    read_requests: float = 0.0
    write_requests: float = 0.0

    def __add__(self, other: Window) -> Window:
        return Window(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes,
                      self.read_requests + other.read_requests, self.write_requests + other.write_requests)


@dataclass(frozen=True)
class _Activity:
    """A phase span that swapped: its bytes per second in each direction."""

    t0_s: float
    t1_s: float
    read_bytes_per_s: float
    write_bytes_per_s: float

    def weight(self, op: str, a_s: float, b_s: float) -> float:
        """Swap bytes this span issued in [a, b) at its mean rate."""
        overlap = min(b_s, self.t1_s) - max(a_s, self.t0_s)
        rate = self.read_bytes_per_s if op == "read" else self.write_bytes_per_s
        return overlap * rate if overlap > 0 else 0.0


def _swap_activity(run: TraceRun) -> tuple[_Activity, ...]:
    att = run.attribution
    if att is None:
        return ()
    seconds: dict[tuple[int, int, str], float] = defaultdict(float)
    for p in att.phases:
        seconds[(p.rank, p.step, p.phase)] += p.seconds
    moved: dict[tuple[int, int, str, str], int] = defaultdict(int)
    for s in att.swaps:
        moved[(s.rank, s.step, s.phase, s.direction)] += s.bytes
    out = []
    for p in att.phases:
        key, secs = (p.rank, p.step, p.phase), seconds[(p.rank, p.step, p.phase)]
        read, write = moved.get((*key, "read"), 0), moved.get((*key, "write"), 0)
        if (read or write) and secs > 0:
            out.append(_Activity((p.t0_ns - run.clock_origin_ns) / 1e9, (p.t1_ns - run.clock_origin_ns) / 1e9,
                                 read / secs, write / secs))
    return tuple(out)


class BlockTimeline:
    """Block I/O on top-level devices, by time window. An interval wholly
    inside a window counts wholly; one across a window's edge is split in
    proportion to the swap bytes the job's phases issued on each side (a swap
    phase ending 3 ms into an interval issued its bytes, not the idle phase
    after it), or by time when no phase in the interval swapped."""

    def __init__(self, run: TraceRun) -> None:
        top = {d.name for d in run.devices if not d.is_lower}
        self.points = sorted((p for p in run.timeline if p.device in top and p.op in ("read", "write")),
                             key=lambda p: p.t_s)
        self.starts_s = [p.t_s for p in self.points]
        self.interval_s = run.interval_s
        self.origin_ns = run.clock_origin_ns
        self.activity = sorted(_swap_activity(run), key=lambda a: a.t0_s)
        self.activity_starts_s = [a.t0_s for a in self.activity]
        self.longest_s = max((a.t1_s - a.t0_s for a in self.activity), default=0.0)

    def _share(self, op: str, b0: float, lo: float, hi: float) -> float:
        b1 = b0 + self.interval_s
        a, b = max(lo, b0), min(hi, b1)
        near = self.activity[bisect_left(self.activity_starts_s, b0 - self.longest_s):
                             bisect_left(self.activity_starts_s, b1)]
        whole = sum(s.weight(op, b0, b1) for s in near)
        if whole > 0:
            return sum(s.weight(op, a, b) for s in near) / whole
        return (b - a) / self.interval_s

    def window(self, t0_ns: int, t1_ns: int) -> Window:
        """Block bytes and requests issued in [t0, t1) (CLOCK_MONOTONIC ns)."""
        lo, hi = (t0_ns - self.origin_ns) / 1e9, (t1_ns - self.origin_ns) / 1e9
        read_bytes = write_bytes = read_requests = write_requests = 0.0
        first, last = bisect_left(self.starts_s, lo - self.interval_s), bisect_left(self.starts_s, hi)
        for p in self.points[first:last]:
            if p.t_s + self.interval_s <= lo:
                continue
            inside = lo <= p.t_s and p.t_s + self.interval_s <= hi
            share = 1.0 if inside else self._share(p.op, p.t_s, lo, hi)
            if p.op == "read":
                read_bytes += p.bytes * share
                read_requests += p.requests * share
            else:
                write_bytes += p.bytes * share
                write_requests += p.requests * share
        return Window(read_bytes, write_bytes, read_requests, write_requests)


@dataclass(frozen=True)
class StepBreakdown:
    """One optimizer step as rank 0 saw it. Its period runs from its first
    phase to the next step's first phase (to its last phase's end for the
    last step): total_s and block I/O cover that period."""

    step: int
    total_s: float
    phase_s: dict[str, float]          # forward, backward, accumulate, optimizer
    block: Window                      # block I/O on top-level devices during the step
    block_by_phase: dict[str, Window]
    swap_read_bytes: int
    swap_write_bytes: int
    t0_ns: int = 0                     # the period (CLOCK_MONOTONIC ns)
    t1_ns: int = 0


def _spans_by_step(spans: tuple[PhaseSpan, ...], rank: int) -> dict[int, list[PhaseSpan]]:
    out: dict[int, list[PhaseSpan]] = defaultdict(list)
    for p in spans:
        if p.rank == rank and p.phase in STEP_PHASES:
            out[p.step].append(p)
    return out


def step_breakdowns(run: TraceRun, rank: int = 0) -> list[StepBreakdown]:
    att = run.attribution
    if att is None:
        return []
    swap_by_step: dict[tuple[int, str], int] = defaultdict(int)
    for s in att.swaps:
        if s.phase:
            swap_by_step[(s.step, s.direction)] += s.bytes
    steps = [(k, spans) for k, spans in sorted(_spans_by_step(att.phases, rank).items())
             if any(p.phase == "forward" for p in spans)]
    block = BlockTimeline(run)
    rows = []
    for i, (step, spans) in enumerate(steps):
        # a step's period runs to the start of the next one, so I/O that a
        # step's optimizer issues asynchronously and that lands between steps
        # still counts for that step; the last step ends with its last phase
        t0 = min(p.t0_ns for p in spans)
        t1 = min(p.t0_ns for p in steps[i + 1][1]) if i + 1 < len(steps) else max(p.t1_ns for p in spans)
        phase_s: dict[str, float] = defaultdict(float)
        by_phase: dict[str, Window] = {}
        for p in spans:
            phase_s[p.phase] += p.seconds
            by_phase[p.phase] = by_phase.get(p.phase, Window()) + block.window(p.t0_ns, p.t1_ns)
        rows.append(StepBreakdown(step, (t1 - t0) / 1e9, dict(phase_s), block.window(t0, t1), by_phase,
                                  swap_by_step[(step, "read")], swap_by_step[(step, "write")], t0, t1))
    return rows


def steady(rows: list[StepBreakdown]) -> list[StepBreakdown]:
    """Steps after the first (warm-up: buffers allocated, swap files created)
    and before the last (its period has no next step to end it: I/O it
    leaves in flight is cut off), or all of them when there are fewer than four."""
    return rows[1:-1] if len(rows) >= 4 else rows


def rate_steps(rows: list[StepBreakdown]) -> list[StepBreakdown]:
    """The steps whose bandwidth is compared with a ceiling: the steady ones,
    never the first (it creates Adam's moments and writes twice what it
    reads) when there is another; empty for a run of one step."""
    return [r for r in steady(rows) if r.step != rows[0].step] if len(rows) > 1 else []


@dataclass(frozen=True)
class CategoryRow:
    category: str
    read_bytes_per_step: float
    write_bytes_per_step: float
    files: int
    outside_read_bytes: int = 0     # swapped outside any training phase (initialisation)
    outside_write_bytes: int = 0


def swap_by_category(run: TraceRun) -> list[CategoryRow]:
    """Median swap-level bytes per step, per category, over steady steps."""
    att = run.attribution
    if att is None:
        return []
    steps = [r.step for r in steady(step_breakdowns(run))]
    per: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    outside: dict[tuple[str, str], int] = defaultdict(int)
    for s in att.swaps:
        if s.phase:
            per[(s.category, s.direction)][s.step] += s.bytes
        else:
            outside[(s.category, s.direction)] += s.bytes
    cats = sorted({c for c, _ in per} | {c for c, _ in outside})
    out = []
    for c in cats:
        med = {d: statistics.median([per[(c, d)].get(k, 0) for k in steps]) if steps else 0.0
               for d in ("read", "write")}
        out.append(CategoryRow(c, med["read"], med["write"], att.swap_files.get(c, 0),
                               outside[(c, "read")], outside[(c, "write")]))
    return out


@dataclass(frozen=True)
class CrossCheck:
    """Block-level vs swap-level bytes over the steady steps."""

    steps: int
    block_read_bytes: float
    block_write_bytes: float
    swap_read_bytes: int
    swap_write_bytes: int

    @property
    def read_diff_pct(self) -> float | None:
        return _pct(self.block_read_bytes, self.swap_read_bytes)

    @property
    def write_diff_pct(self) -> float | None:
        return _pct(self.block_write_bytes, self.swap_write_bytes)


def _pct(block: float, swap: int) -> float | None:
    return None if swap == 0 else 100.0 * (block - swap) / swap


def cross_check(run: TraceRun) -> CrossCheck | None:
    rows = steady(step_breakdowns(run))
    if not rows:
        return None
    return CrossCheck(
        steps=len(rows),
        block_read_bytes=sum(r.block.read_bytes for r in rows),
        block_write_bytes=sum(r.block.write_bytes for r in rows),
        swap_read_bytes=sum(r.swap_read_bytes for r in rows),
        swap_write_bytes=sum(r.swap_write_bytes for r in rows),
    )


@dataclass(frozen=True)
class MedianStep:
    """Median seconds and bytes per step over the steady steps, each field
    its own median (so the phases need not add up to total_s)."""

    steps: int                  # steady steps the medians are over
    total_s: float
    forward_s: float
    backward_s: float
    accumulate_s: float
    optimizer_s: float
    read_bytes: float           # block level, top-level devices
    write_bytes: float
    swap_read_bytes: float      # DeepSpeed swap level
    swap_write_bytes: float

    def phase_s(self, phase: str) -> float:
        """Median seconds of one of STEP_PHASES."""
        return {"forward": self.forward_s, "backward": self.backward_s, "accumulate": self.accumulate_s,
                "optimizer": self.optimizer_s}[phase]


def median_step(rows: list[StepBreakdown]) -> MedianStep | None:
    """Medians over the steady steps of `rows`; None when there are none."""
    rows = steady(rows)
    if not rows:
        return None

    def med(values: Iterable[float]) -> float:
        return float(statistics.median(values))

    def phase(name: str) -> float:
        return med(r.phase_s.get(name, 0.0) for r in rows)

    return MedianStep(
        steps=len(rows), total_s=med(r.total_s for r in rows),
        forward_s=phase("forward"), backward_s=phase("backward"), accumulate_s=phase("accumulate"),
        optimizer_s=phase("optimizer"),
        read_bytes=med(r.block.read_bytes for r in rows), write_bytes=med(r.block.write_bytes for r in rows),
        swap_read_bytes=med(r.swap_read_bytes for r in rows), swap_write_bytes=med(r.swap_write_bytes for r in rows),
    )


@dataclass(frozen=True)
class CheckpointRow:
    """One save_checkpoint call: its duration, the block I/O during it, and
    the block I/O from its start to the end of the trace (checkpoints are
    written through the page cache; writeback can land after the call)."""

    t_s: float          # start, seconds on the run's timeline
    seconds: float
    during: Window
    until_end: Window


def checkpoints(run: TraceRun, rank: int = 0) -> list[CheckpointRow]:
    att = run.attribution
    if att is None:
        return []
    end_ns = run.clock_origin_ns + int((max((p.t_s for p in run.timeline), default=0.0) + run.interval_s) * 1e9)
    block = BlockTimeline(run)
    return [
        CheckpointRow((p.t0_ns - run.clock_origin_ns) / 1e9, p.seconds, block.window(p.t0_ns, p.t1_ns),
                      block.window(p.t0_ns, max(end_ns, p.t1_ns)))
        for p in att.phases if p.rank == rank and p.phase == "checkpoint"
    ]
