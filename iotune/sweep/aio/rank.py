"""Stage 3 of a sweep, rank: trials -> Ranked rows, medians and spread over
repeats, best first.

The tie rule. Points whose medians differ by less than the noise (MIN_NOISE,
or the larger spread of the two) form a tier with the best of them. Inside a
tier the higher measured median still comes first: a cheaper point never
jumps ahead of a faster one (on the built-in drive, fio put 256K/qd4 in a tie
with the best and real optimizer steps found it 7 % slower than DeepSpeed's
defaults). Only medians closer than RESOLUTION, which no trial can tell
apart, are ordered cheapest first. The tier's front is what the steps
confirmation (confirm.py) measures against DeepSpeed's defaults, so when
steps are on, real training steps decide between tied points. The order
depends on the medians and the points only: a replayed journal ranks the
same way.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

from ...model.sweep import Trial
from ...model.sweep_result import MIN_NOISE, Ranked, tie

# Medians within 0.1 % are one value: below what a trial resolves (fio's runtime
# is in ms over seconds-long directions, bandwidth steps are of that order).
RESOLUTION = 0.001


def summarize_trials(trials: Sequence[Trial], executor: str) -> list[Ranked]:
    groups: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        if t.executor == executor:
            groups[t.point.key()].append(t)
    out = []
    for ts in groups.values():
        ok = [t.measurement for t in ts if t.status == "ok" and t.measurement]
        scores = tuple(m.score for m in ok)
        med = statistics.median(scores) if scores else 0.0
        spread = (max(scores) - min(scores)) / med if len(scores) > 1 and med > 0 else 0.0
        steps = [m.step_s for m in ok if m.step_s]
        opt = [m.optimizer_step_s for m in ok if m.optimizer_step_s]
        out.append(Ranked(
            point=ts[0].point, executor=executor, scores=scores, failed=len(ts) - len(ok), median=med,
            spread=spread,
            read_bytes_per_s=statistics.median([m.read_bytes_per_s for m in ok]) if ok else 0.0,
            write_bytes_per_s=statistics.median([m.write_bytes_per_s for m in ok]) if ok else 0.0,
            step_s=statistics.median(steps) if steps else None,
            optimizer_step_s=statistics.median(opt) if opt else None,
        ))
    return out


def rank(rows: list[Ranked], noise: float = MIN_NOISE) -> list[Ranked]:
    """Best first; failed points last. Inside a tier of ties (see the module
    docstring) the higher median still leads, and only medians within
    RESOLUTION are ordered cheapest first."""
    ok = sorted((r for r in rows if r.scores), key=lambda r: -r.median)
    out: list[Ranked] = []
    while ok:
        head = ok[0]
        tier = [r for r in ok if tie(head, r, noise)]
        # faster first at the trials' resolution, then cheaper, then block size and the
        # point's key: the same measurements always rank the same way
        tier.sort(key=lambda r: (-_level(r.median), r.cost, r.point.block_size, r.point.key()))
        out += tier
        ok = [r for r in ok if r not in tier]
    return out + [r for r in rows if not r.scores]


def _level(median: float) -> int:
    """The median on a log scale in steps of RESOLUTION: equal levels are
    indistinguishable medians."""
    return math.floor(math.log(median) / math.log1p(RESOLUTION))


def first_pass(trials: Sequence[Trial], executor: str,
               keys: set[str] | None = None) -> list[Ranked]:
    """The ranking from repeat 0 only (of `keys`, or of every point). The
    adaptive search decides on exactly what an uninterrupted run had at that
    moment, so replaying a journal (after a crash or Ctrl-C) takes the same path."""
    return rank(summarize_trials([t for t in trials if t.executor == executor and t.repeat == 0
                                  and (keys is None or t.point.key() in keys)], executor))
