"""Stage 4 of a sweep, confirm: the finalists and DeepSpeed's defaults,
measured again on real training steps (the built-in nvme-opt workload,
optimizer state swapped to the target, or the user's own job through
--steps-cmd) in alternating pairs, so that real
optimizer-step time decides.

The finalists are the front of the executor's ranking (its tier of ties
first, see rank.py), at most `confirm_top` of them, DeepSpeed's defaults
left out (they are the reference). Round by round, each finalist runs and
then the defaults run right after it: candidate, default, candidate,
default, ... Each pair's ratio (default / candidate optimizer-step time)
compares two runs taken back to back, so slow drift of a shared machine
cancels. After each pair the confirmation rule (sequential.py) decides that
finalist or asks for another pair; a decided finalist runs no more pairs,
and none runs more than `confirm_pairs` (the rule's maximum). Every trial
is journaled as it ends: the candidate's repeat index is its round, the
defaults' is round x finalists + the finalist's place, whichever finalists
are still running, so a resumed sweep reaches the same decisions from the
journal and takes each pair from it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from collections.abc import Callable

from ...model.sweep import SweepPoint, Trial
from ...model.sweep_result import Progress, Ranked, StepGain
from ..executor import Executor, Target
from ..journal import Journal
from ..measure import Measurer
from .rank import summarize_trials
from .recommend import best_gain, pair_ratios, step_gain
from ..sequential import SequentialRule, decide
from ..space import RunSettings
from .steps_executor import StepsExecutor


MAX_QUEUE_DEPTH = 128


def finalists(ranking: list[Ranked], default: SweepPoint, top: int) -> list[SweepPoint]:
    """`top` points other than the defaults: the executor's best; then
    DeepSpeed's defaults with only the queue depth raised so as many bytes
    are in flight as the best keeps (block size x queue depth, Little's law:
    what a latency-bound drive needs); then the best of each further block
    size; then the rest in ranking order.

    The second finalist is the smallest change from the defaults that has
    the best's bytes in flight. fio cannot judge everything real steps
    depend on: DeepSpeed cuts each swapped tensor into requests of the block
    size (a block size that wins on fio's large files can lose on a job's
    smaller tensors), and fio has no overlap_events. On the striped bed the
    fio winners (4 MiB, 2 threads, single_submit, no overlap) ran the
    optimizer step 0.7x as fast as the defaults (docs/benchmarks.md)."""
    measured = [r.point for r in ranking if r.scores and r.point.key() != default.key()]
    if not measured or top <= 0:
        return []
    best = measured[0]
    chosen = [best]
    if best.block_size != default.block_size:
        qd = min(MAX_QUEUE_DEPTH, max(1, -(-best.block_size * best.queue_depth // default.block_size)))
        deeper = replace(default, queue_depth=qd)
        if deeper.key() != default.key():
            chosen.append(deeper)
    for p in measured:
        if p.block_size not in {c.block_size for c in chosen}:
            chosen.append(p)
    chosen += [p for p in measured if p not in chosen]
    return chosen[:top]


def pair_plan(candidates: list[SweepPoint], default: SweepPoint,
              rounds: int) -> list[tuple[SweepPoint, int, int]]:
    """(candidate, its repeat, the defaults' repeat) in the order they run."""
    n = len(candidates)
    return [(c, r, r * n + j) for r in range(rounds) for j, c in enumerate(candidates)]


def confirm_rule(run: RunSettings) -> SequentialRule:
    """The rule with the profile's floor and maximum (its other settings: the defaults)."""
    return SequentialRule(noise_floor=run.noise_floor, max_pairs=max(1, run.confirm_pairs))


def run_pairs(candidates: list[SweepPoint], default: SweepPoint, rule: SequentialRule,
              measure: Callable[[SweepPoint, int], Trial],
              say: Callable[[str], None] = lambda s: None) -> dict[str, list[tuple[Trial, Trial]]]:
    """Each finalist's (candidate, default) trial pairs, run in the order of
    pair_plan until the rule decides it (at rule.max_pairs at the latest)."""
    pairs: dict[str, list[tuple[Trial, Trial]]] = {c.key(): [] for c in candidates}
    decided: set[str] = set()
    for cand, c_rep, d_rep in pair_plan(candidates, default, rule.max_pairs):
        key = cand.key()
        if key in decided:
            continue
        pairs[key].append((measure(cand, c_rep), measure(default, d_rep)))
        d = decide(pair_ratios(pairs[key]), rule, final=c_rep == rule.max_pairs - 1)
        if d.decided:
            decided.add(key)
            say(f"confirmed bs={cand.block_size} qd={cand.queue_depth} t={cand.intra_op_parallelism}: {d.verdict} "
                f"after {c_rep + 1} pair(s) (median {d.median:.2f}x the defaults' speed, bound "
                f"{d.lower:.2f}-{d.upper:.2f}x)" if d.pairs else
                f"confirmed bs={cand.block_size} qd={cand.queue_depth}: no usable pair in {c_rep + 1}")
    return pairs


def confirm_on_steps(ranking: list[Ranked], default: SweepPoint, run: RunSettings, target: Target,
                     journal: Journal, on_trial: Callable[[Progress], None] | None = None,
                     say: Callable[[str], None] = lambda s: None,
                     steps: Executor | None = None) -> tuple[list[Ranked], StepGain | None]:
    """(the training-step trials' rows, fastest optimizer step first; the
    best candidate's gain over the defaults). ([], None) when confirm_top is
    0. `steps` is the training-step executor (default: the built-in
    workload; the user's job with --steps-cmd)."""
    candidates = finalists(ranking, default, run.confirm_top)
    if run.confirm_top <= 0 or not candidates:
        return [], None
    rule = confirm_rule(run)
    steps = steps or StepsExecutor(steps=run.steps, timeout_s=run.steps_timeout_s)
    say(f"confirming {len(candidates)} candidate(s) against DeepSpeed's defaults with {run.steps} "
        f"{getattr(steps, 'what', 'training steps each')}, in alternating pairs until the confirmation rule "
        f"decides ({rule.first_look} to {rule.max_pairs} pair(s) each)")
    measurer = Measurer(steps, target, journal, on_trial, planned=2 * len(candidates) * rule.first_look)
    pairs = run_pairs(candidates, default, rule, measurer.measure, say)
    gain = best_gain([step_gain(c, pairs[c.key()], rule) for c in candidates])
    if gain is not None and isinstance(steps, StepsExecutor):
        gain = replace(gain, split=steps.gain_split(default, gain.candidate, gain.median))
    keys = {default.key(), *pairs}
    rows = summarize_trials([t for t in journal.trials if t.point.key() in keys], steps.name)
    rows.sort(key=lambda r: (r.optimizer_step_s or math.inf, r.point.key()))
    return rows, gain
