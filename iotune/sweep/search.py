"""Choosing which points to measure: an exhaustive grid, or the default
adaptive search.

Adaptive search, in stages, each ranked with ties inside the noise going to
the cheaper point:
1. block size, at DeepSpeed's default queue depth and one thread;
2. queue depth, at the best block size;
3. threads, single_submit, overlap_events and engine, one at a time around
   the best;
4. the diagonal neighbours of the best (block size and queue depth one step
   either way);
5. the finalists, plus DeepSpeed's default configuration as the reference,
   measured again up to `repeats` times.
Every measurement goes through `Sweeper.measure`, which consults the journal
first, so a resumed sweep repeats no completed trial and, for a deterministic
drive, reaches the same ranking as an uninterrupted one.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..analysis.sweep import rank, summarize_trials
from ..model.aio import DEEPSPEED_AIO_DEFAULTS
from ..model.sweep import SweepPoint, Trial
from ..model.sweep_result import Progress, Ranked
from .executor import Executor, Target, TrialFailed
from .journal import Journal
from .space import RunSettings, SearchSpace


class Sweeper:
    def __init__(self, executor: Executor, target: Target, space: SearchSpace, settings: RunSettings,
                 journal: Journal, on_trial: Callable[[Progress], None] | None = None) -> None:
        self.executor, self.target, self.space, self.settings = executor, target, space, settings
        self.journal, self.on_trial = journal, on_trial
        self.done = 0
        self.planned = self.estimate()
        self._seen: set[tuple[str, int]] = set()      # consulted in this run

    def estimate(self) -> int:
        s, r = self.space, self.settings
        if r.search == "grid":
            return len(list(self.grid())) * r.repeats
        variations = sum(len(v) - 1 for v in (s.intra_op_parallelism, s.single_submit, s.overlap_events, s.engine))
        return len(s.block_size) + len(s.queue_depth) - 1 + variations + 4 + (r.finalists + 1) * (r.repeats - 1)

    def measure(self, point: SweepPoint, repeat: int = 0) -> Trial:
        """The trial of (point, repeat): from the journal if there is one,
        else run now and journaled. Progress is reported once per trial."""
        found = self.journal.done(self.executor.name, point.key(), repeat)
        if found is not None and (point.key(), repeat) in self._seen:
            return found
        self._seen.add((point.key(), repeat))
        if found is None:
            found = self._run(point, repeat)
            self.journal.record(found)
            reused = False
        else:
            reused = True
        self.done += 1
        if self.on_trial:
            self.on_trial(Progress(self.done, max(self.planned, self.done), found, reused))
        return found

    def _run(self, point: SweepPoint, repeat: int) -> Trial:
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        try:
            m, raw = self.executor.run(point, self.target)
            return Trial(self.executor.name, point, repeat, "ok", m, "", started, time.perf_counter() - t0, raw)
        except TrialFailed as e:
            return Trial(self.executor.name, point, repeat, "failed", None, str(e), started,
                         time.perf_counter() - t0, e.raw)

    def ranking(self) -> list[Ranked]:
        return rank(summarize_trials(self.journal.trials, self.executor.name))

    def _first_pass(self, keys: set[str] | None = None) -> list[Ranked]:
        """Ranking from repeat 0 only (of `keys`, or of every point). The search's
        decisions use exactly what an uninterrupted run had at that moment, so
        replaying a journal — after a crash or Ctrl-C — takes the same path."""
        trials = [t for t in self.journal.trials if t.executor == self.executor.name and t.repeat == 0
                  and (keys is None or t.point.key() in keys)]
        return rank(summarize_trials(trials, self.executor.name))

    def _best(self, points: list[SweepPoint]) -> SweepPoint:
        rows = self._first_pass({p.key() for p in points})
        return rows[0].point if rows and rows[0].scores else points[0]

    def grid(self) -> Iterable[SweepPoint]:
        s = self.space
        for bs, qd, t, ss, oe, eng in itertools.product(s.block_size, s.queue_depth, s.intra_op_parallelism,
                                                          s.single_submit, s.overlap_events, s.engine):
            yield SweepPoint(bs, qd, t, ss, oe, eng)

    def run(self) -> list[Ranked]:
        if self.settings.search == "grid":
            for rep in range(self.settings.repeats):
                for p in self.grid():
                    self.measure(p, rep)
            return self.ranking()
        return self._adaptive()

    def start_point(self) -> SweepPoint:
        s, d = self.space, DEEPSPEED_AIO_DEFAULTS
        return SweepPoint(
            block_size=_nearest(s.block_size, d.block_size), queue_depth=_nearest(s.queue_depth, d.queue_depth),
            intra_op_parallelism=s.intra_op_parallelism[0],
            single_submit=d.single_submit if d.single_submit in s.single_submit else s.single_submit[0],
            overlap_events=d.overlap_events if d.overlap_events in s.overlap_events else s.overlap_events[0],
            engine=s.engine[0],
        )

    def _sweep_dim(self, best: SweepPoint, field: str, values: Iterable[object]) -> SweepPoint:
        """Measure `best` with each of `values` in `field`; the best of them."""
        pts = [replace(best, **{field: v}) for v in values]
        for p in pts:
            self.measure(p)
        return self._best(pts)

    def _adaptive(self) -> list[Ranked]:
        s, r = self.space, self.settings
        best = self._sweep_dim(self.start_point(), "block_size", s.block_size)
        best = self._sweep_dim(best, "queue_depth", s.queue_depth)
        for field in ("intra_op_parallelism", "single_submit", "overlap_events", "engine"):
            best = self._sweep_dim(best, field, getattr(s, field))
        for p in _diagonal(best, s):
            self.measure(p)
        finalists = [row.point for row in self._first_pass()[: r.finalists] if row.scores]
        reference = self.default_point()
        self.measure(reference, 0)
        for rep in range(1, r.repeats):
            for p in finalists + [reference]:
                self.measure(p, rep)
        return self.ranking()

    def default_point(self) -> SweepPoint:
        """DeepSpeed's default aio configuration, the baseline to beat."""
        d = DEEPSPEED_AIO_DEFAULTS
        return SweepPoint(d.block_size, d.queue_depth, d.intra_op_parallelism, d.single_submit,
                          d.overlap_events, self.space.engine[0])


def _nearest(values: tuple[int, ...], want: int) -> int:
    return min(values, key=lambda v: (abs(v - want), v))


def _diagonal(best: SweepPoint, s: SearchSpace) -> list[SweepPoint]:
    bi, qi = s.block_size.index(best.block_size), s.queue_depth.index(best.queue_depth)
    out = []
    for db, dq in ((-1, -1), (-1, 1), (1, -1), (1, 1)):
        b, q = bi + db, qi + dq
        if 0 <= b < len(s.block_size) and 0 <= q < len(s.queue_depth):
            out.append(replace(best, block_size=s.block_size[b], queue_depth=s.queue_depth[q]))
    return out
