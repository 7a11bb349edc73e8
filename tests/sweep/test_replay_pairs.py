"""A candidate against a reference on replays in ABBA pairs
(iotune.sweep.replay_pairs, shared by the aio sweep and the offload search),
with a stand-in replayer of known seconds: one child per look, more looks
while the rule is undecided, every batch journaled and taken from the
journal on a re-run, and a budget that stops before a batch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from iotune.model.aio import AioSettings
from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule
from iotune.model.replay_result import ReplayResult
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.replay_pairs import pair_orders, replay_pairs
from iotune.sweep.sequential import SequentialRule

SCHEDULE = SwapSchedule((SwapGroup((SwapOp("read", "a.swp", 1 << 20),), wait_s=0.1),), step=1, optimizer_s=0.2,
                        traced_s=0.2)
REFERENCE, CANDIDATE = (SCHEDULE, AioSettings()), (SCHEDULE, AioSettings(queue_depth=32))


class Replayer:
    """run_replay_plan: the reference 1.0 s; the candidate's seconds, one per replay in turn."""

    def __init__(self, candidate_s: Sequence[float]) -> None:
        self.candidate_s = list(candidate_s)
        self.orders: list[tuple[int, ...]] = []

    def __call__(self, entries: Sequence[tuple[SwapSchedule, AioSettings]], order: Sequence[int],
                 target: Target, **kw: Any) -> tuple[tuple[int, ReplayResult], ...]:
        self.orders.append(tuple(order))
        out = []
        for i in order:
            s, aio = entries[i]
            seconds = 1.0 if i == 0 else self.candidate_s.pop(0)
            out.append((i, ReplayResult(seconds, s.read_bytes, 0, s.read_bytes, 0, (), aio, True)))
        return tuple(out)


def test_pairs_alternate_which_runs_first() -> None:
    assert pair_orders(0, 3) == [1, 0, 0, 1, 1, 0] and pair_orders(3, 2) == [0, 1, 1, 0]


def test_an_undecided_first_look_gets_more_pairs_each_batch_journaled_and_reused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ratios 1.30, 0.95, 1.20 leave the rule undecided at 3 pairs, so a second child runs pairs 3-5."""
    replayer = Replayer([1 / 1.30, 1 / 0.95, 1 / 1.20, 1 / 1.25, 1 / 1.25, 1 / 1.25])
    monkeypatch.setattr("iotune.sweep.replay_pairs.run_replay_plan", replayer)
    journal, rule = Journal(tmp_path / "j.jsonl"), SequentialRule(max_pairs=6)
    got = replay_pairs(journal, Target(tmp_path), "k", REFERENCE, CANDIDATE, rule)
    assert got is not None and replayer.orders == [tuple(pair_orders(0, 3)), tuple(pair_orders(3, 3))]
    assert got.reference_seconds == (1.0,) * 6 and got.decision.pairs == 6
    assert [round(1 / s, 2) for s in got.seconds] == [1.30, 0.95, 1.20, 1.25, 1.25, 1.25]
    assert [(b.key, b.batch) for b in Journal(tmp_path / "j.jsonl").offload_replays] == [("k", 0), ("k", 3)]
    monkeypatch.setattr("iotune.sweep.replay_pairs.run_replay_plan", Replayer([]))     # nothing left to run
    again = replay_pairs(Journal(tmp_path / "j.jsonl"), Target(tmp_path), "k", REFERENCE, CANDIDATE, rule,
                         fits=lambda pairs: False)
    assert again == got


def test_a_budget_stops_before_a_batch_the_journal_does_not_hold(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    replayer = Replayer([1 / 1.30, 1 / 0.95, 1 / 1.20])
    monkeypatch.setattr("iotune.sweep.replay_pairs.run_replay_plan", replayer)
    asked: list[int] = []

    def fits(pairs: int) -> bool:
        asked.append(pairs)
        return len(asked) == 1
    got = replay_pairs(Journal(tmp_path / "j.jsonl"), Target(tmp_path), "k", REFERENCE, CANDIDATE,
                       SequentialRule(max_pairs=6), fits)
    assert got is not None and asked == [3, 3] and len(replayer.orders) == 1
    assert (got.decision.verdict, got.decision.pairs) == ("undecided", 3)
    assert replay_pairs(Journal(tmp_path / "other.jsonl"), Target(tmp_path), "k", REFERENCE, CANDIDATE,
                        SequentialRule(), lambda pairs: False) is None
