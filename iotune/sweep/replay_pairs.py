"""A candidate against a reference on replays of their swap schedules, in
ABBA pairs decided by the sequential rule (iotune.sweep.sequential): the
search's stand-in for real-step pairs, shared by the offload search (its
candidates' derived schedules) and the aio sweep (the job's schedule at
each finalist's aio settings).

Each batch of pairs is one replayer child (run_replay_plan: both schedules,
each at its own aio setting, in the pairs' order), journaled as it ends
(ReplayBatch, under the candidate's key), so a re-run takes it from the
journal. The first batch is the rule's first look; more follow, one look
at a time, while the rule is undecided, up to its max_pairs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..model.aio import AioSettings
from ..model.offload_plan import ReplayBatch
from ..model.replay import SwapSchedule
from .executor import Target
from .journal import Journal
from .replay import run_replay_plan
from .sequential import PairDecision, SequentialRule, candidate_first, decide

REFERENCE, CANDIDATE = 0, 1       # the entries' indices in a pair's plan


def replay_batch(journal: Journal, target: Target, key: str, n: int,
                 entries: Sequence[tuple[SwapSchedule, AioSettings]], order: Sequence[int]) -> ReplayBatch:
    """Replay batch n of `key`, from the journal or run now (and journaled)."""
    seen = journal.find_replay(key, n)
    if seen is not None:
        return seen
    t0 = time.monotonic()
    results = run_replay_plan(entries, order, target)
    batch = ReplayBatch(key, n, tuple(order), tuple(round(r.seconds, 6) for _, r in results),
                        round(time.monotonic() - t0, 3))
    journal.record_replay(batch)
    return batch


def pair_orders(first: int, count: int) -> list[int]:
    """Pairs first..first+count-1 in ABBA order: 1 is the candidate, 0 the reference."""
    return [i for n in range(first, first + count) for i in ((1, 0) if candidate_first(n) else (0, 1))]


@dataclass(frozen=True)
class PairReplays:
    """A candidate's replays and the reference's in the same pairs, in order, and the rule's decision."""

    seconds: tuple[float, ...]
    reference_seconds: tuple[float, ...]
    decision: PairDecision


def replay_pairs(journal: Journal, target: Target, key: str, reference: tuple[SwapSchedule, AioSettings],
                 candidate: tuple[SwapSchedule, AioSettings], rule: SequentialRule,
                 fits: Callable[[int], bool] = lambda pairs: True) -> PairReplays | None:
    """`candidate` against `reference` in ABBA pairs until the rule decides or rule.max_pairs, each
    look one batch; `fits(pairs)` is asked before a batch the journal does not hold (False: stop
    there). None when not even the first look ran. ReplayError from a failed child."""
    entries = [reference, candidate]
    mine: list[float] = []
    ref: list[float] = []
    n = 0
    decision = decide([], rule)
    while n < rule.max_pairs and not decision.decided:
        count = min(rule.first_look, rule.max_pairs - n)
        if journal.find_replay(key, n) is None and not fits(count):
            break
        batch = replay_batch(journal, target, key, n, entries, pair_orders(n, count))
        mine, ref = mine + list(batch.of(CANDIDATE)), ref + list(batch.of(REFERENCE))
        n += count
        decision = decide([r / c for r, c in zip(ref, mine)], rule)
    if not mine:
        return None
    return PairReplays(tuple(mine), tuple(ref), decision)
