"""Stage 2 of a sweep, measure: each proposed (point, repeat) becomes a Trial,
taken from the journal when it is there, else run by the executor and
journaled the moment it ends. A failed trial is recorded, not raised."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import replace

from ..model.sweep import Proposal, SweepPoint, Trial
from ..model.sweep_result import Progress, Running
from .executor import DriveGone, Executor, SweepStopped, Target, TrialFailed
from .journal import Journal


class Measurer:
    """One executor on one target, writing to one journal. `planned` is the
    expected number of trials, for progress displays."""

    def __init__(self, executor: Executor, target: Target, journal: Journal,
                 on_trial: Callable[[Progress], None] | None = None, planned: int = 0) -> None:
        self.executor, self.target, self.journal, self.on_trial = executor, target, journal, on_trial
        self.planned = planned
        self.done = 0
        self._seen: set[tuple[str, int]] = set()      # consulted in this run
        self._stop = ""                                # why the sweep cannot go on (TrialFailed.stops_sweep)

    def measure_all(self, proposal: Proposal) -> list[Trial]:
        return [self.measure(p, proposal.repeat) for p in proposal.points]

    def measure(self, point: SweepPoint, repeat: int = 0, pair_order: str = "") -> Trial:
        """The trial of (point, repeat): from the journal if there is one,
        else run now and journaled, with the confirmation pair's order when
        it is one (`pair_order`). Progress is reported once per trial, and
        while one runs, at its start and at each of its training steps."""
        found = self.journal.done(self.executor.name, point.key(), repeat)
        if found is not None and (point.key(), repeat) in self._seen:
            return found
        self._seen.add((point.key(), repeat))
        reused = found is not None
        if found is None:
            self._tell(Running(self.executor.name, point, repeat))
            found = replace(self._run(point, repeat), pair_order=pair_order)
            self.journal.record(found)
        self.done += 1
        if self.on_trial:
            self.on_trial(Progress(self.done, max(self.planned, self.done), found, reused))
        if self._stop:
            raise SweepStopped(f"sweep stopped: {self._stop}; every finished trial is in the journal "
                               f"{self.journal.path}: run the same command again to resume")
        return found

    def _run(self, point: SweepPoint, repeat: int) -> Trial:
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        name = self.executor.name
        target = self.target if self.on_trial is None else replace(
            self.target, on_step=lambda s: self._tell(Running(name, point, repeat, s)))
        try:
            m, raw = self.executor.run(point, target)
            return Trial(name, point, repeat, "ok", m, "", started, time.perf_counter() - t0, raw)
        except OSError:
            # the executor's own files on a drive that died (EIO, an ext4 gone read-only): the drive is
            # named when it is known to be gone; otherwise this stays the error it was
            self._stop_if_the_drive_is_gone(point, repeat)
            raise
        except TrialFailed as e:
            self._stop_if_the_drive_is_gone(point, repeat)
            if e.stops_sweep:
                self._stop = str(e)
            return Trial(name, point, repeat, "failed", None, str(e), started, time.perf_counter() - t0, e.raw)

    def _tell(self, running: Running) -> None:
        if self.on_trial:
            self.on_trial(Progress(self.done, max(self.planned, self.done + 1), None, running=running))

    def _stop_if_the_drive_is_gone(self, point: SweepPoint, repeat: int) -> None:
        """DriveGone, naming the drive, when the trial failed because the drive
        itself is gone: the failure says nothing about `point`."""
        gone = self.target.trouble() if self.target.trouble else None
        if gone:
            p = point
            raise DriveGone(f"{gone}. The trial bs={p.block_size} qd={p.queue_depth} "
                            f"t={p.intra_op_parallelism} rep {repeat} failed on it and is not recorded; the journal "
                            f"{self.journal.path} keeps the {len(self.journal.trials)} trial(s) completed before "
                            f"it: run the same command again to resume on a fresh drive")
