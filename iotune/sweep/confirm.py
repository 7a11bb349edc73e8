"""Stage 4 of a sweep, confirm: the top candidates and DeepSpeed's default,
measured again on real training steps (the built-in nvme-opt workload,
optimizer state swapped to the target, or the user's own job through
--steps-cmd) and ranked by step time."""

from __future__ import annotations

from collections.abc import Callable

from ..model.sweep import SweepPoint
from ..model.sweep_result import Progress, Ranked
from .executor import Executor, Target
from .journal import Journal
from .measure import Measurer
from .rank import rank, summarize_trials
from .space import RunSettings
from .steps_executor import StepsExecutor


def confirm_on_steps(ranking: list[Ranked], default: SweepPoint, run: RunSettings, target: Target,
                     journal: Journal, on_trial: Callable[[Progress], None] | None = None,
                     say: Callable[[str], None] = lambda s: None,
                     steps: Executor | None = None) -> list[Ranked]:
    """The training-step executor's ranking (`steps`, default the built-in
    workload) of the top `run.confirm_top` points of `ranking` and `default`
    ([] when confirm_top is 0)."""
    if run.confirm_top <= 0:
        return []
    candidates = [r.point for r in ranking[: run.confirm_top] if r.scores]
    points = list(dict.fromkeys([*candidates, default]))
    steps = steps or StepsExecutor(steps=run.steps, timeout_s=run.steps_timeout_s)
    say(f"confirming {len(candidates)} candidate(s) and DeepSpeed's defaults with "
        f"{run.steps} {getattr(steps, 'what', 'training steps each')}")
    measurer = Measurer(steps, target, journal, on_trial, planned=len(points))
    for p in points:
        measurer.measure(p)
    return rank(summarize_trials(journal.trials, steps.name))
