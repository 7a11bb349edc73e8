"""The aio sweep's plan within its budget (`iotune sweep aio --budget`): a
record of the sweep, produced by iotune.sweep.aio.budget, rendered by
iotune.render.sweep.

It is made once the first training-step trial is timed (the recording run at
DeepSpeed's defaults, or without a replay stage the first confirmation
trial); what ran before it (the aio search on the drive, that trial, the
fidelity replays) is spent. The rest is fitted to what is left in this
order, each part at its measured cost (a trial: that first trial's wall
time; a finalist's first look on replays: the fidelity replays' child,
scaled to the first look's replays):

  1. the replay ranking, its first look (3 ABBA pairs) for every finalist:
     the cheapest information, so first;
  2. the first look of the confirmation on real steps (3 pairs of each
     candidate confirmed: the replay's pick, or every finalist when the
     replay cannot rank): the rule cannot decide from fewer;
  3. the thread table (one trial per OMP_NUM_THREADS value, if asked);
  4. further confirmation pairs, up to the profile's confirm_pairs.

What does not fit is cut, and said (`cut`). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from . import units
from .budget_fit import FIRST_LOOK_PAIRS, PlanJson, parts_that_fit


@dataclass(frozen=True)
class AioPlan(PlanJson):
    """What the aio sweep will run on training steps and replays, fitted to its budget."""

    budget_s: float
    budget_source: str                 # "--budget 45m" or how the default was derived
    trial_s: float                     # one training-step trial (the first one's wall time)
    spent_s: float                     # before the plan: the aio search, the first trial, the fidelity replays
    replay_candidates: int             # finalists ranked on replays (their first look fits)
    replay_s: float
    confirming: int                    # candidates confirmed on real steps
    max_pairs: int                     # each, at most
    pairs_s: float
    thread_trials: int                 # the thread table's trials
    threads_s: float
    cut: tuple[str, ...] = ()          # what the budget cut, in words

    @property
    def estimated_s(self) -> float:
        return self.spent_s + self.replay_s + self.pairs_s + self.threads_s

    def describe(self) -> list[str]:
        """The plan as the sweep prints it before it goes on."""
        lines = [f"plan within {units.duration(self.budget_s)} ({self.budget_source}); spent so far "
                 f"{units.duration(self.spent_s)} (the aio search, the first training-step trial"
                 f"{' and the fidelity replays' if self.replay_candidates else ''})"]
        if self.replay_candidates:
            lines.append(f"  replays: {self.replay_candidates} finalist(s) ranked against DeepSpeed's defaults, at "
                         f"least {FIRST_LOOK_PAIRS} ABBA pairs of replays each (≈ {units.duration(self.replay_s)})")
        lines.append(f"  training steps: at most {self.max_pairs} pair(s) with DeepSpeed's defaults for each of "
                     f"{self.confirming} candidate(s) (≈ {units.duration(self.pairs_s)}) at "
                     f"{units.duration(self.trial_s)} a trial")
        if self.thread_trials:
            lines.append(f"  CPU-optimizer threads: {self.thread_trials} trial(s) (≈ {units.duration(self.threads_s)})")
        lines.append(f"  estimated: {units.duration(self.estimated_s)} of {units.duration(self.budget_s)}")
        return lines + [f"  cut to fit the budget: {c}" for c in self.cut]



def fit_aio_plan(budget_s: float, source: str, trial_s: float, spent_s: float, replayable: int,
                 first_look_s: float, confirming: int, max_pairs: int, thread_trials: int) -> AioPlan:
    """The plan for `replayable` finalists on replays (a first look: `first_look_s`),
    `confirming` candidates on real steps at most `max_pairs` pairs each, and
    `thread_trials`, cut (in the module's order) to what `budget_s` holds."""
    left = budget_s - spent_s
    ranked = parts_that_fit(left, first_look_s, replayable)
    left -= ranked * first_look_s
    round_s = 2 * trial_s * confirming               # one pair of every candidate confirmed
    first = parts_that_fit(left, round_s, min(FIRST_LOOK_PAIRS, max_pairs)) if confirming else 0
    left -= first * round_s
    threads = parts_that_fit(left, trial_s, thread_trials)
    left -= threads * trial_s
    pairs = first + (parts_that_fit(left, round_s, max_pairs - first) if confirming else 0)
    cut = []
    if ranked < replayable:
        cut.append(f"{ranked} of {replayable} finalists ranked on replays")
    if confirming and pairs < max_pairs:
        cut.append(f"at most {pairs} confirmation pair(s) each, not {max_pairs}"
                   + (f" (the rule decides from {FIRST_LOOK_PAIRS}: the sweep will stay undecided)"
                      if pairs < FIRST_LOOK_PAIRS else ""))
    if threads < thread_trials:
        cut.append(f"{threads} of {thread_trials} thread-table trials")
    return AioPlan(budget_s, source, trial_s, spent_s, ranked, ranked * first_look_s, confirming,
                   pairs if confirming else 0, pairs * round_s, threads, threads * trial_s, tuple(cut))
