"""The whole-offload search's last stage, confirm: the fastest candidate and
the reference (the job's own config, or the smallest change that fits) in
pairs, one pair at a time, until the sequential rule (iotune.sweep.sequential)
decides. The two trials of a pair run back to back, in the order the rule
gives for the pair (the candidate first in even pairs, the reference first
in odd ones), and each trial is journaled with that order.

When the pairs show the two equal within the rule's resolution (its interval
inside 1 / (1 + floor) .. 1 + floor: neither is faster by the floor), speed
cannot choose, so what else they cost does (`rank_by_cost`): the most
host-memory headroom (the lower predicted peak), then the fewest bytes moved
per step; the outcome says which was kept and why (`tie_break`)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...model import units
from ...model.host_memory import host_memory
from ...model.offload import JobShape, OffloadKnobs, measured_gain_split, step_swap_bytes
from ...model.offload_result import OffloadTrial
from ...model.sweep_result import more_pairs_phrase
from ..sequential import PairDecision, SequentialRule, candidate_first, decide, pair_order
from .changes import knob_changes

if TYPE_CHECKING:
    from ..budget import SearchClock
    from .search import OffloadSearch, Trials


@dataclass(frozen=True)
class Confirmation:
    ratios: tuple[float, ...]
    verdict: str                     # faster | within noise | slower | undecided | none (no usable pair)
    candidate: OffloadKnobs | None
    gain: Any
    decision: str = ""               # the rule's account, in words
    rule: PairDecision | None = None
    more_s: float = 0.0              # undecided: the time of the pairs the rule still needs
    stopped: str = ""                # undecided: what stopped the pairs (budget | max pairs)


def run_pair(candidate: OffloadKnobs, reference: OffloadKnobs, n: int, trials: Trials) -> tuple[OffloadTrial,
                                                                                                OffloadTrial]:
    """Pair n (candidate, reference), run in the order the rule gives for it."""
    order = pair_order(n)
    if candidate_first(n):
        c = trials.run(candidate, "pair-candidate", n, pair_order=order)
        return c, trials.run(reference, "pair-base", n, pair_order=order)
    b = trials.run(reference, "pair-base", n, pair_order=order)
    return trials.run(candidate, "pair-candidate", n, pair_order=order), b


def confirm_pairs(candidate: OffloadKnobs, reference: OffloadKnobs, shape: JobShape, trials: Trials,
                  search: OffloadSearch, clock: SearchClock | None = None, max_pairs: int | None = None,
                  pair_s: float = 0.0) -> Confirmation:
    """Pairs, one at a time, until the sequential rule decides, --max-pairs,
    `max_pairs` (the plan's) or the budget (`clock`: a pair not in the journal
    runs only if `pair_s`, or the pairs' median, still fits); each ratio is the
    candidate's samples per second over the reference's. Undecided: the time of
    the pairs it still needs, at the pairs' measured trial times."""
    rule = SequentialRule(noise_floor=search.noise_floor, max_pairs=search.max_pairs)
    limit = rule.max_pairs if max_pairs is None else min(max_pairs, rule.max_pairs)
    seen: list[tuple[OffloadTrial, OffloadTrial]] = []
    spent: list[float] = []
    decision = decide([], rule)
    stopped = ""
    for n in range(rule.max_pairs):
        each = statistics.median(spent) if spent else pair_s
        if (n >= limit or clock is not None and not clock.fits(each)) and \
                not _journaled(candidate, reference, n, trials):
            stopped = "budget"
            break
        c, b = run_pair(candidate, reference, n, trials)
        spent.append(c.seconds + b.seconds)
        if c.status == b.status == "ok" and b.samples_per_s > 0:
            seen.append((c, b))
        decision = decide([c.samples_per_s / b.samples_per_s for c, b in seen], rule)
        if decision.decided:
            break
    ratios = tuple(c.samples_per_s / b.samples_per_s for c, b in seen)
    more_s = decision.more_pairs_needed * (statistics.median(spent) if spent else pair_s)
    gain = None
    if decision.verdict == "faster":
        gain = measured_gain_split(reference, candidate, shape, decision.center,
                                   int(statistics.median(b.swapped_bytes for _, b in seen)),
                                   int(statistics.median(c.swapped_bytes for c, _ in seen)),
                                   max(host_memory(candidate, shape, search.context).peak_bytes
                                       - host_memory(reference, shape, search.context).peak_bytes, 0))
    if not decision.decided and not stopped:
        stopped = "max pairs"
    return Confirmation(ratios, decision.verdict if ratios else "none", candidate, gain,
                        describe_decision(decision, more_s) if ratios else "", decision, more_s, stopped)


def _journaled(candidate: OffloadKnobs, reference: OffloadKnobs, n: int, trials: Trials) -> bool:
    """Whether both trials of pair n are in the journal (they cost nothing)."""
    return all(trials.journal.find_offload(json.dumps(knob_changes(trials.base, k), sort_keys=True), role, n)
               is not None for k, role in ((candidate, "pair-candidate"), (reference, "pair-base")))


def describe_decision(d: PairDecision, more_s: float = 0.0) -> str:
    """The rule's verdict with its numbers, in the words the report prints."""
    n = f"{d.pairs} pair{'s' if d.pairs != 1 else ''}"
    floor = f"the {100 * d.floor:.0f} % worth reporting"
    if not d.estimated:
        return (f"{d.center:.2f}x from {n}: undecided: no noise estimate; the rule needs "
                f"{more_pairs_phrase(d.more_pairs_needed, more_s, least=True)}")
    noise = (f"{100 * d.spread:.1f} % of noise per pair ("
             + ("as the pairs measured it" if d.measured >= max(d.assumed, d.known) else
                "the least the rule assumes" if d.assumed >= d.known else "as known from elsewhere") + ")")
    if math.isfinite(d.upper):
        interval = f"its {100 * (1 - d.alpha):.0f} % interval {d.lower:.2f}-{d.upper:.2f}x"
    else:
        interval = "no interval before the rule's first look"
    said = {"faster": f"faster (above {floor})", "undecided": f"undecided ({floor} neither cleared nor excluded; "
            f"{more_pairs_phrase(d.more_pairs_needed, more_s)} would settle it)"}.get(d.verdict, f"{d.verdict} "
                                                                                           f"(not above {floor})")
    text = (f"geometric mean of {n} {d.center:.2f}x, {interval} allowing for {noise}: {said}; at most "
            f"{d.max_pairs} pairs")
    if d.noisy:
        text += (f"; noisy: the pairs spread more than the {100 * d.resolvable:.1f} % per pair that {d.max_pairs} "
                 f"pairs resolve at the floor" if d.resolvable else
                 f"; noisy: {d.max_pairs} pairs cannot resolve the floor at any spread (the rule first decides at "
                 f"3 pairs)")
    return text


@dataclass(frozen=True)
class Cost:
    """What a config costs besides its speed: its name in the report, the
    host-memory model's peak for one rank, and the bytes it moves per step."""

    name: str
    peak_host_bytes: int
    moved_bytes_per_step: int


def cost_of(name: str, knobs: OffloadKnobs, shape: JobShape, search: OffloadSearch) -> Cost:
    return Cost(name, host_memory(knobs, shape, search.context).peak_bytes,
                2 * sum(step_swap_bytes(knobs, shape).values()))


def rank_by_cost(tied: Sequence[Cost]) -> list[Cost]:
    """Configs equal in speed, cheapest first: the most host-memory headroom
    (the lowest peak), then the fewest bytes moved per step; ties keep their
    order (the reference is given first, so it stays when nothing differs)."""
    return sorted(tied, key=lambda c: (c.peak_host_bytes, c.moved_bytes_per_step))


def tie_break(ranked: Sequence[Cost], ratios: Sequence[float], d: PairDecision) -> str:
    """Why the first of `ranked` (two configs the pairs `ratios` found equal)
    was kept: "equal within noise (pairs ...); kept X: 13.60 GB peak vs 18.20 GB"."""
    kept, other = ranked[0], ranked[1]
    if kept.peak_host_bytes != other.peak_host_bytes:
        why = f"{units.volume(kept.peak_host_bytes)} peak vs {units.volume(other.peak_host_bytes)}"
    elif kept.moved_bytes_per_step != other.moved_bytes_per_step:
        why = (f"the same peak, {units.volume(kept.moved_bytes_per_step)} moved per step vs "
               f"{units.volume(other.moved_bytes_per_step)}")
    else:
        why = "the same peak and bytes per step"
    return (f"equal within noise (pairs {', '.join(f'{r:.2f}' for r in ratios)}: interval {d.lower:.2f}-"
            f"{d.upper:.2f}x, inside +-{100 * d.floor:.0f} %); kept {kept.name}: {why}")
