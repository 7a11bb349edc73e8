"""Stage 4 of a sweep, confirm: the finalists and DeepSpeed's defaults,
measured again on real training steps (the built-in nvme-opt workload,
optimizer state swapped to the target, or the user's own job through
--steps-cmd) in pairs, so that real optimizer-step time decides.

The finalists are the front of the executor's ranking (its tier of ties
first, see rank.py), at most `confirm_top` of them, DeepSpeed's defaults
left out (they are the reference). Round by round, each finalist and the
defaults run back to back, in the order the rule gives: the finalist first
in even rounds, the defaults first in odd ones (ABBA blocks, so drift and
whichever-runs-first effects cancel). Each pair's ratio (default /
candidate optimizer-step time) compares two runs taken back to back. After
each pair the confirmation rule (sequential.py) decides that finalist or
asks for another pair; a decided finalist runs no more pairs, and none runs
more than `confirm_pairs`. Every trial is journaled as it ends, with its
pair's order: the candidate's repeat index is its round, the defaults' is
round x finalists + the finalist's place, whichever finalists are still
running, and the order follows from the round, so a resumed sweep reaches
the same decisions from the journal and takes each pair from it.
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
from ..sequential import PairDecision, SequentialRule, candidate_first, decide, pair_order
from ..space import RunSettings
from .budget import AioBudget
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
              measure: Callable[[SweepPoint, int, str], Trial],
              say: Callable[[str], None] = lambda s: None,
              fits: Callable[[SweepPoint, int, int], bool] = lambda c, c_rep, d_rep: True
              ) -> dict[str, list[tuple[Trial, Trial]]]:
    """Each finalist's (candidate, default) trial pairs, run in the order of
    pair_plan until the rule decides it (rule.max_pairs at the most) or
    `fits(candidate, its repeat, the defaults' repeat)` says the pair does not
    fit the budget (that finalist stays as its pairs left it); within a pair,
    the order the rule gives for its round (`measure` gets it)."""
    pairs: dict[str, list[tuple[Trial, Trial]]] = {c.key(): [] for c in candidates}
    decided: set[str] = set()
    for cand, c_rep, d_rep in pair_plan(candidates, default, rule.max_pairs):
        key = cand.key()
        if key in decided:
            continue
        if not fits(cand, c_rep, d_rep):
            decided.add(key)
            say(_said(cand, decide(pair_ratios(pairs[key]), rule), c_rep) + "; the budget stopped its pairs")
            continue
        order = pair_order(c_rep)
        if candidate_first(c_rep):
            c = measure(cand, c_rep, order)
            pairs[key].append((c, measure(default, d_rep, order)))
        else:
            d = measure(default, d_rep, order)
            pairs[key].append((measure(cand, c_rep, order), d))
        verdict = decide(pair_ratios(pairs[key]), rule)
        if verdict.decided or c_rep == rule.max_pairs - 1:
            decided.add(key)
            say(_said(cand, verdict, c_rep + 1))
    return pairs


def _said(cand: SweepPoint, d: PairDecision, ran: int) -> str:
    name = f"confirmed {cand.label()}"
    if not d.pairs:
        return f"{name}: no usable pair in {ran}"
    interval = f"interval {d.lower:.2f}-{d.upper:.2f}x" if math.isfinite(d.upper) else "no interval yet"
    more = f"; about {d.more_pairs_needed} more pair(s) would settle it" if not d.decided else ""
    return (f"{name}: {d.verdict} after {ran} pair(s) (geometric mean {d.center:.2f}x the defaults' speed, "
            f"{interval}){more}")


def confirm_on_steps(ranking: list[Ranked], default: SweepPoint, run: RunSettings, target: Target,
                     journal: Journal, on_trial: Callable[[Progress], None] | None = None,
                     say: Callable[[str], None] = lambda s: None,
                     steps: Executor | None = None,
                     candidates: list[SweepPoint] | None = None,
                     budget: AioBudget | None = None) -> tuple[list[Ranked], StepGain | None]:
    """(the training-step trials' rows, fastest optimizer step first; the
    best candidate's gain over the defaults). ([], None) when confirm_top is
    0. `steps` is the training-step executor (default: the built-in
    workload; the user's job with --steps-cmd); `candidates` the points to
    confirm (default: the ranking's finalists; the replay's pick when the
    replay ranked them); `budget` stops pairs that do not fit it (the
    journal's cost nothing), and without a recording run its plan is made
    once the first trial is timed. The rows leave out trials outside the
    pairs (the recording run at the defaults, repeat < 0)."""
    if candidates is None:
        candidates = finalists(ranking, default, run.confirm_top)
    if run.confirm_top <= 0 or not candidates:
        return [], None
    rule = confirm_rule(run)
    steps = steps or StepsExecutor(steps=run.steps, timeout_s=run.steps_timeout_s)
    if budget is not None:
        budget.make_plan(0, 0.0, len(candidates))         # made here unless the replay stage made it
    most = min(rule.max_pairs, budget.plan.max_pairs) if budget is not None and budget.plan else rule.max_pairs
    limit = (f"from {rule.first_look} pairs, at most {most} each" if most >= rule.first_look
             else f"at most {most} each, fewer than the {rule.first_look} it decides from: it will say how "
                  f"many more it needs")
    say(f"confirming {len(candidates)} candidate(s) against DeepSpeed's defaults with {run.steps} "
        f"{getattr(steps, 'what', 'training steps each')}, in pairs of alternating order until the confirmation "
        f"rule decides ({limit})")
    planned = 2 * len(candidates) * min(rule.first_look, rule.max_pairs)
    measurer = Measurer(steps, target, journal, on_trial, planned=planned)
    name = steps.name

    def measure(point: SweepPoint, repeat: int, order: str) -> Trial:
        trial = measurer.measure(point, repeat, order)
        if budget is not None:
            budget.timed(trial.seconds, "the first training-step trial")
            budget.make_plan(0, 0.0, len(candidates))
        return trial

    stopped: list[SweepPoint] = []          # the candidates whose pairs the budget stopped

    def fits(cand: SweepPoint, c_rep: int, d_rep: int) -> bool:
        journaled = journal.done(name, cand.key(), c_rep) and journal.done(name, default.key(), d_rep)
        ok = budget is None or bool(journaled) or budget.pair_fits(c_rep)
        stopped.extend([] if ok else [cand])
        return ok

    pairs = run_pairs(candidates, default, rule, measure, say, fits)
    gains = [step_gain(c, pairs[c.key()], rule) for c in candidates]
    if budget is not None:
        budget.undecided_pairs(stopped, [pairs[c.key()] for c in stopped], rule)
    gain = best_gain(gains)
    if gain is not None and isinstance(steps, StepsExecutor):
        gain = replace(gain, split=steps.gain_split(default, gain.candidate, gain.estimate))
    keys = {default.key(), *pairs}
    rows = summarize_trials([t for t in journal.trials if t.point.key() in keys and t.repeat >= 0], steps.name)
    rows.sort(key=lambda r: (r.optimizer_step_s or math.inf, r.point.key()))
    return rows, gain
