"""Stage 1 of a sweep, propose: which points to measure, as a generator of
Proposals that is sent back the journaled trials after each one. An
exhaustive grid, or the default adaptive search.

Adaptive search, in stages, each ranked (rank.first_pass; inside the noise
the faster median still leads, see rank.py):
1. block size, at DeepSpeed's default queue depth and one thread;
2. queue depth, at the best block size;
3. threads, single_submit, overlap_events and engine, one at a time around
   the best;
4. the diagonal neighbours of the best (block size and queue depth one step
   either way);
5. the finalists, plus DeepSpeed's default configuration as the reference,
   measured again up to `repeats` times.
Decisions use repeat-0 trials only, so a resumed sweep, whose measure stage
takes completed trials from the journal, takes the same path.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterable, Sequence
from dataclasses import replace

from ...model.aio import DEEPSPEED_AIO_DEFAULTS
from ...model.sweep import Proposal, SweepPoint, Trial
from .rank import first_pass
from ..space import RunSettings, SearchSpace

Proposals = Generator[Proposal, Sequence[Trial], None]
ADAPTIVE_FIELDS = ("intra_op_parallelism", "single_submit", "overlap_events", "engine")


def propose(space: SearchSpace, settings: RunSettings, executor: str) -> Proposals:
    if settings.search == "grid":
        return _grid(space, settings)
    return _adaptive(space, settings, executor)


def planned_trials(space: SearchSpace, settings: RunSettings) -> int:
    """How many trials the search will run (adaptive: an upper estimate)."""
    s, r = space, settings
    if r.search == "grid":
        return len(grid_points(s)) * r.repeats
    variations = sum(len(getattr(s, f)) - 1 for f in ADAPTIVE_FIELDS)
    return len(s.block_size) + len(s.queue_depth) - 1 + variations + 4 + (r.finalists + 1) * (r.repeats - 1)


def grid_points(s: SearchSpace) -> list[SweepPoint]:
    return [SweepPoint(bs, qd, t, ss, oe, eng) for bs, qd, t, ss, oe, eng in itertools.product(
        s.block_size, s.queue_depth, s.intra_op_parallelism, s.single_submit, s.overlap_events, s.engine)]


def default_point(space: SearchSpace) -> SweepPoint:
    """DeepSpeed's default aio configuration, the baseline to beat."""
    d = DEEPSPEED_AIO_DEFAULTS
    return SweepPoint(d.block_size, d.queue_depth, d.intra_op_parallelism, d.single_submit,
                      d.overlap_events, space.engine[0])


def start_point(space: SearchSpace) -> SweepPoint:
    s, d = space, DEEPSPEED_AIO_DEFAULTS
    return SweepPoint(
        block_size=_nearest(s.block_size, d.block_size), queue_depth=_nearest(s.queue_depth, d.queue_depth),
        intra_op_parallelism=s.intra_op_parallelism[0],
        single_submit=d.single_submit if d.single_submit in s.single_submit else s.single_submit[0],
        overlap_events=d.overlap_events if d.overlap_events in s.overlap_events else s.overlap_events[0],
        engine=s.engine[0],
    )


def _grid(space: SearchSpace, settings: RunSettings) -> Proposals:
    points = tuple(grid_points(space))
    for rep in range(settings.repeats):
        yield Proposal(points, rep)


def _adaptive(space: SearchSpace, settings: RunSettings, executor: str) -> Proposals:
    s, r = space, settings
    best = start_point(s)
    for field in ("block_size", "queue_depth", *ADAPTIVE_FIELDS):
        points = [replace(best, **{field: v}) for v in getattr(s, field)]
        trials = yield Proposal(tuple(points))
        best = _best(trials, executor, points)
    trials = yield Proposal(tuple(_diagonal(best, s)))
    finalists = [row.point for row in first_pass(trials, executor)[: r.finalists] if row.scores]
    reference = default_point(s)
    yield Proposal((reference,), 0)
    for rep in range(1, r.repeats):
        yield Proposal((*finalists, reference), rep)


def _best(trials: Sequence[Trial], executor: str, points: list[SweepPoint]) -> SweepPoint:
    rows = first_pass(trials, executor, {p.key() for p in points})
    return rows[0].point if rows and rows[0].scores else points[0]


def _nearest(values: Iterable[int], want: int) -> int:
    return min(values, key=lambda v: (abs(v - want), v))


def _diagonal(best: SweepPoint, s: SearchSpace) -> list[SweepPoint]:
    bi, qi = s.block_size.index(best.block_size), s.queue_depth.index(best.queue_depth)
    out = []
    for db, dq in ((-1, -1), (-1, 1), (1, -1), (1, 1)):
        b, q = bi + db, qi + dq
        if 0 <= b < len(s.block_size) and 0 <= q < len(s.queue_depth):
            out.append(replace(best, block_size=s.block_size[b], queue_depth=s.queue_depth[q]))
    return out
