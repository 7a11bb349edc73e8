"""The offload search's time budget (`--budget`): what this invocation may
spend, counted from its start, and what it could not decide when something
did not fit. Without --budget the default is DEFAULT_BUDGET_TRIALS trials of
the job as the reference trial measured them: room for --max-trials' 12
real-step candidates and --max-pairs' 6 pairs at their defaults, the replays
counted against it at their own measured cost. Trials and replays the
journal already holds cost nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...model import units

DEFAULT_BUDGET_TRIALS = 24


@dataclass
class SearchClock:
    """The budget (None: not known yet: the default waits for the reference
    trial's time), when the search started, and what the budget stopped."""

    budget_s: float | None = None
    source: str = ""
    started_s: float = field(default_factory=time.monotonic)
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

    def default_from(self, trial_s: float) -> None:
        """Without --budget: DEFAULT_BUDGET_TRIALS x a trial's wall time."""
        if self.budget_s is None:
            self.budget_s = DEFAULT_BUDGET_TRIALS * trial_s
            self.source = f"the default: {DEFAULT_BUDGET_TRIALS} x the reference trial's {units.duration(trial_s)}"


def clock_for(budget_s: float | None) -> SearchClock:
    if budget_s is None:
        return SearchClock()
    return SearchClock(budget_s, f"--budget {units.duration(budget_s)}")
