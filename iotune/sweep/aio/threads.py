"""The CPU-optimizer thread dimension (omp_threads): the recommended aio
point measured on training steps at each OMP_NUM_THREADS value, as in
the thread table of Xinnor's published offload benchmark
(optimizer-step time against CPU threads:
DeepSpeedCPUAdam is memory-bandwidth-bound, so beyond a few threads it stops
paying). Only training steps can vary it: fio and DeepSpeed's aio engine do
no optimizer math, so a sweep without a training-step stage refuses it
(command.check_dimensions) rather than ignoring it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...model.sweep import SweepPoint
from ...model.sweep_result import Progress, Ranked
from ..executor import Executor, Target
from ..journal import Journal
from ..measure import Measurer
from .budget import AioBudget
from .rank import MIN_NOISE, summarize_trials


def thread_values(values: tuple[int, ...]) -> tuple[int, ...]:
    """The thread counts to measure; () when the space leaves threads unset."""
    return tuple(dict.fromkeys(values)) if any(v > 0 for v in values) else ()


def sweep_threads(base: SweepPoint, values: tuple[int, ...], steps: Executor, target: Target, journal: Journal,
                  on_trial: Callable[[Progress], None] | None = None,
                  say: Callable[[str], None] = lambda s: None, budget: AioBudget | None = None) -> list[Ranked]:
    """`base` at each thread count in `values`, one trial each (those the
    `budget` has no room for are not run, and said); the rows in thread-count
    order (0, OMP_NUM_THREADS unset, first)."""
    values = thread_values(values)
    if not values:
        return []
    points = [replace(base, omp_threads=v) for v in values]
    say(f"CPU-optimizer threads: the recommended aio settings at OMP_NUM_THREADS "
        f"{', '.join(str(v) if v else 'unset' for v in values)}, on training steps")
    measurer = Measurer(steps, target, journal, on_trial, planned=len(points))
    for p in points:
        if budget is not None and journal.done(steps.name, p.key(), 0) is None and not budget.trial_fits():
            budget.unmeasured_threads(p.omp_threads)
            continue
        measurer.measure(p)
    keys = {p.key() for p in points}
    pairs = [t for t in journal.trials if t.repeat >= 0]       # not the recording run (sweep.aio.replay_rank)
    rows = [r for r in summarize_trials(pairs, steps.name) if r.point.key() in keys]
    return sorted(rows, key=lambda r: r.point.omp_threads)


def best_threads(rows: list[Ranked], noise: float = MIN_NOISE) -> int:
    """The thread count to use: the fewest threads whose optimizer step is
    within the noise of the fastest (threads left over serve I/O and data
    loading); 0 when nothing was measured."""
    timed = [r for r in rows if r.optimizer_step_s]
    if not timed:
        return 0
    fastest = min(r.optimizer_step_s or 0.0 for r in timed)
    fit = [r for r in timed if (r.optimizer_step_s or 0.0) <= fastest * (1 + noise)]
    return min(fit, key=lambda r: (r.point.omp_threads or 1 << 30)).point.omp_threads
