"""The aio sweep's time budget (`--budget`): the shared clock
(iotune.sweep.budget, counted from the sweep's start, so the aio search on
the drive counts too) and the plan (iotune.model.aio_plan), made once the
first training-step trial is timed and printed before the rest runs. Each
stage asks `fits` before it runs what the journal does not hold; what the
budget stopped is said, with what deciding it would take."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...model import units
from ...model.aio_plan import AioPlan, fit_aio_plan
from ...model.budget_fit import FIRST_LOOK_PAIRS
from ...model.offload_plan import undecided_pairs, undecided_unrun
from ...model.sweep import SweepPoint, Trial
from ..budget import SearchClock
from ..sequential import SequentialRule, decide
from .recommend import pair_ratios, pair_seconds

DEFAULTS = "DeepSpeed's defaults"        # what every aio candidate is compared with


@dataclass
class AioBudget:
    clock: SearchClock
    confirm_pairs: int                  # the profile's most pairs per candidate
    thread_trials: int                  # the thread table's trials (0: no table)
    say: Callable[[str], None] = lambda s: None
    trial_s: float = 0.0                # the first training-step trial's wall time (0: none yet)
    plan: AioPlan | None = None

    def timed(self, seconds: float, trial: str) -> None:
        """The first training-step trial's wall time (`trial`: which one, in words): the unit
        of the default budget, and the plan's cost of a trial. Later trials change neither."""
        if self.trial_s <= 0 < seconds:
            self.trial_s = seconds
            self.clock.default_from(seconds, trial, max(0.0, self.clock.spent_s() - seconds), "the aio search")

    def make_plan(self, replayable: int, first_look_s: float, confirming: int) -> AioPlan | None:
        """The plan (once; printed), from what is left of the budget. None before a trial is timed."""
        if self.plan is None and self.trial_s > 0:
            self.plan = fit_aio_plan(self.clock.budget_s or 0.0, self.clock.source, self.trial_s,
                                     self.clock.spent_s(), replayable, first_look_s, confirming,
                                     max(1, self.confirm_pairs), self.thread_trials)
            for line in self.plan.describe():
                self.say(line)
        return self.plan

    def replay_planned(self, index: int) -> bool:
        """Whether the plan holds the replays of finalist `index` (0-based; no plan: yes)."""
        ok = self.plan is None or index < self.plan.replay_candidates
        self.clock.stopped = self.clock.stopped or not ok
        return ok

    def unranked(self, name: str) -> None:
        """A finalist the budget left unranked on replays, said in the outcome's undecided list."""
        each = self.plan.replay_s / self.plan.replay_candidates if self.plan and self.plan.replay_candidates else 0.0
        self.clock.undecided.append(undecided_unrun(name, "not ranked on replays", each, DEFAULTS))

    def replay_fits(self, pairs: int) -> bool:
        """Whether `pairs` more replay pairs of a finalist fit (at the plan's cost of a first look)
        beside what the plan keeps for the training steps (its pairs and thread trials): more looks
        on replays never eat the time of the pairs that decide."""
        if self.plan is None or not self.plan.replay_candidates:
            return self.clock.fits(0.0)
        per_pair = self.plan.replay_s / self.plan.replay_candidates / FIRST_LOOK_PAIRS
        return self.clock.fits(pairs * per_pair + self.plan.pairs_s + self.plan.threads_s)

    def pair_fits(self, pair: int) -> bool:
        """Whether confirmation pair `pair` (0-based) of a candidate may run: within the plan's
        pairs and what is left of the budget (before the first trial is timed: always)."""
        if self.plan is None:
            return True
        ok = pair < self.plan.max_pairs and self.clock.fits(2 * self.trial_s)
        self.clock.stopped = self.clock.stopped or not ok
        return ok

    def undecided_pairs(self, candidates: Sequence[SweepPoint], pairs: Sequence[Sequence[tuple[Trial, Trial]]],
                        rule: SequentialRule) -> None:
        """The candidates whose pairs the budget stopped, undecided on real steps, with the pairs
        deciding would take."""
        for cand, got in zip(candidates, pairs):
            d = decide(pair_ratios(got), rule)
            each = pair_seconds(got) or 2 * self.trial_s        # its pairs' own time, as the report's sentence
            if not d.decided:
                self.clock.undecided.append(undecided_pairs(cand.label(), d.more_pairs_needed,
                                                            d.more_pairs_needed * each,
                                                            least=not d.estimated, against=DEFAULTS))

    def trial_fits(self) -> bool:
        """Whether one more training-step trial fits (the thread table's)."""
        return self.trial_s <= 0 or self.clock.fits(self.trial_s)

    def unmeasured_threads(self, threads: int) -> None:
        """A thread count the budget left out of the table."""
        self.say(f"CPU-optimizer threads: OMP_NUM_THREADS={threads or 'unset'} not measured: the budget has no "
                 f"room for its trial (≈ {units.duration(self.trial_s)})")
        self.clock.undecided.append(f"not measured: OMP_NUM_THREADS={threads or 'unset'} in the thread table "
                                    f"(≈ {units.duration(self.trial_s)})")

    def stopped(self) -> str:
        return "budget" if self.clock.stopped else ""
