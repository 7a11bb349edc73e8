"""A sweep's time budget (`--budget`), shared by `sweep offload` and `sweep
aio`: what this invocation may spend, counted from its start, and what it
could not decide when something did not fit. Without --budget the default is
DEFAULT_BUDGET_TRIALS trials of the job as its first training-step trial
measured them (the offload search's reference trial, the aio sweep's
recording run at DeepSpeed's defaults): room for --max-trials' 12 real-step
candidates and --max-pairs' 6 pairs of the offload search, or the aio
sweep's 2 finalists at 6 pairs each, at their defaults; but no more than
DEFAULT_BUDGET_CAP_S, so a sweep with the defaults ends within the hour (at
1B on a 2-vCPU machine a trial takes about 4 minutes, so 24 of them would be
100 minutes). A job whose trials are so long that the hour holds fewer than
FLOOR_TRIALS gets those: the first trial and the 3 pairs the confirmation
rule needs before it can decide anything. Replays count against the budget
at their own measured cost; trials and replays the journal already holds
cost nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..model import units
from .sequential import SequentialRule

DEFAULT_BUDGET_TRIALS = 24
DEFAULT_BUDGET_CAP_S = 3600.0
FLOOR_TRIALS = 1 + 2 * SequentialRule().min_pairs      # the reference trial and the rule's first 3 pairs: 7


@dataclass
class SearchClock:
    """The budget (None: not known yet: the default waits for the reference
    trial's time), when the search started, and what the budget stopped."""

    budget_s: float | None = None
    source: str = ""
    started_s: float = field(default_factory=lambda: time.monotonic())     # looked up at the start (tests stand in)
    stopped: bool = False             # something planned did not fit what was left
    undecided: list[str] = field(default_factory=list)

    def spent_s(self) -> float:
        return time.monotonic() - self.started_s

    def left_s(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - self.spent_s()

    def fits(self, estimate_s: float) -> bool:
        """Whether `estimate_s` more fits the budget; if not, the budget has stopped the search."""
        ok = estimate_s <= self.left_s()
        self.stopped = self.stopped or not ok
        return ok

    def default_from(self, trial_s: float, trial: str = "the reference trial", before_s: float = 0.0,
                     before: str = "") -> None:
        """Without --budget: DEFAULT_BUDGET_TRIALS x a trial's wall time (`trial`: which one, in
        words), at most DEFAULT_BUDGET_CAP_S (or FLOOR_TRIALS x it, if that is more); `before_s`
        (`before`: what, in words) was spent before that trial on what the budget does not cut
        (the aio sweep's search on the drive), and is added to each."""
        if self.budget_s is not None:
            return
        whole, floor = before_s + DEFAULT_BUDGET_TRIALS * trial_s, before_s + FLOOR_TRIALS * trial_s
        cap = max(DEFAULT_BUDGET_CAP_S, floor)
        self.budget_s = min(whole, cap)
        spent = f"{before}'s {units.duration(before_s)} + " if before_s > 0 else ""
        self.source = f"the default: {spent}{DEFAULT_BUDGET_TRIALS} x {trial}'s {units.duration(trial_s)}"
        if whole > cap:
            why = (f" ({FLOOR_TRIALS} trials: {trial} and the {SequentialRule().min_pairs} pairs the rule "
                   f"needs)" if floor > DEFAULT_BUDGET_CAP_S else "")
            self.source += f" ({units.duration(whole)}), capped at {units.duration(cap)}{why}"


def clock_for(budget_s: float | None) -> SearchClock:
    if budget_s is None:
        return SearchClock()
    return SearchClock(budget_s, f"--budget {units.duration(budget_s)}")
