"""The confirmation rule (iotune/sweep/sequential.py) on synthetic series
(pure): A/A never "faster", a clear gain stopped at the minimum of pairs,
one outlier forgiven, a clear slowdown, the maximum always decided, and
the error rates its docstring states reproduced by seeded simulation; then
the aio sweep's confirmation adding pairs one at a time, and resuming from
its journal."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import IotuneError
from iotune.model.sweep import Measurement, SweepPoint
from iotune.model.sweep_result import Ranked
from iotune.sweep import sequential
from iotune.sweep.aio.confirm import confirm_on_steps
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.sequential import SequentialRule, decide, simulate
from iotune.sweep.space import RunSettings

RULE = SequentialRule()                       # floor 5 %, 3 to 6 pairs, z 3, at least 2 % per pair


def verdicts(ratios: list[float], rule: SequentialRule = RULE) -> list[str]:
    """The verdict after each pair, as a sweep asks."""
    return [decide(ratios[:n], rule).verdict for n in range(1, len(ratios) + 1)]


def test_a_clear_gain_stops_at_the_minimum_of_pairs() -> None:
    assert verdicts([1.30, 1.31, 1.29]) == ["undecided", "undecided", "faster"]
    d = decide([1.30, 1.31, 1.29])
    assert (d.pairs, d.median, d.measured, d.assumed) == (3, 1.30, pytest.approx(1.4826 * math.log(1.31 / 1.30)), 0.02)
    h = 3 * 0.02 / math.sqrt(3)                                       # the assumed 2 %: the pairs show less
    assert (d.lower, d.upper) == (pytest.approx(1.30 * math.exp(-h)), pytest.approx(1.30 * math.exp(h)))


def test_one_outlier_does_not_veto_a_real_gain() -> None:
    """1.17, 0.99, 1.20: the range rule (noise = max - min = 0.21) called
    this within noise; the median with its MAD bound says faster."""
    d = decide([1.17, 0.99, 1.20])
    mad = math.log(1.20 / 1.17)                                        # |ln 1.20 - ln 1.17| < |ln 0.99 - ln 1.17|
    h = 3 * 1.4826 * mad / math.sqrt(3)
    assert d.verdict == "faster" and d.median == 1.17
    assert d.lower == pytest.approx(1.17 * math.exp(-h)) == pytest.approx(1.0964, abs=1e-4)
    assert d.measured == pytest.approx(1.4826 * mad) and not d.noisy
    assert decide([1.17, 0.99], SequentialRule(max_pairs=3)).verdict == "undecided"   # 2 of 3 pairs: run the 3rd


def test_a_clear_slowdown_and_clearly_no_gain_stop_early() -> None:
    assert verdicts([0.80, 0.82, 0.81]) == ["undecided", "undecided", "slower"]
    assert verdicts([1.00, 1.01, 0.99]) == ["undecided", "undecided", "within noise"]
    assert decide([1.00, 1.01, 0.99]).upper < 1.05                      # no gain worth reporting, shown


def test_the_maximum_is_always_decided_and_never_faster_without_the_bound() -> None:
    wide = [1.10, 0.95, 1.25, 1.00, 1.15, 0.90]                      # median 1.05, pairs spread ±14 %
    assert verdicts(wide) == ["undecided"] * 5 + ["within noise"]
    d = decide(wide)
    assert d.pairs == d.max_pairs == 6 and d.lower < 1.05 < d.upper and d.noisy
    assert decide(wide[:4], SequentialRule(max_pairs=4)).verdict == "within noise"
    assert decide(wide[:4], final=True).verdict == "within noise"    # no further pair can come
    near = [1.03] * 6                                                   # a 3 % gain: under the floor
    assert verdicts(near) == ["undecided"] * 5 + ["within noise"]


def test_below_the_minimum_only_the_end_decides() -> None:
    assert decide([2.0, 2.0]).verdict == "undecided"                   # a huge gain waits for the 3rd pair
    assert decide([2.0, 2.0], final=True).verdict == "within noise"     # fewer than 3 usable: not shown
    assert decide([], final=True).verdict == "within noise" and decide([]).verdict == "undecided"
    one = SequentialRule(max_pairs=1)                                  # confirm_pairs = 1: the minimum follows
    assert one.first_look == 1 and decide([1.3], one).verdict == "faster"
    assert decide([1.1], one).verdict == "within noise"                 # 1.1 x exp(-3 x 2 %) < 1.05


def test_a_ratio_that_is_no_ratio_and_a_rule_without_pairs_are_refused() -> None:
    with pytest.raises(IotuneError, match=r"a pair's ratio must be a positive number \(got \[1.2, 0.0\]\)"):
        decide([1.2, 0.0])
    with pytest.raises(IotuneError, match="at least 1 pair .*set confirm_pairs to 1 or more"):
        SequentialRule(max_pairs=0)


def test_a_and_a_is_never_faster() -> None:
    """300 A/A comparisons under this machine's measured noise (0.5 % per
    pair, one pair in ten disturbed by 10 %), then 300 at four times the
    noise: none reported faster; most stop at 3 pairs."""
    for core in (0.005, 0.02):
        s = simulate(RULE, gain=1.0, core=core, outliers=0.1, outlier_spread=0.1, decisions=300, seed=7)
        assert s.faster == 0 and s.slower + s.within_noise == 300
        assert sorted(s.pairs)[150] == 3 and max(s.pairs) <= 6


def test_the_stated_error_rates_are_reproduced() -> None:
    """The docstring's row "core 2 %, 10 % of pairs @ 10 %": 0.05 % of A/A
    decisions faster, a 1.15x gain found in 99.9 %, after 3 pairs (median).
    10,000 seeded A/A decisions give a count a 0.05 % rate allows (Poisson
    mean 5: 1 to 14 holds 99.5 % of it); 2,000 with the gain find it in all
    but a handful."""
    row = " ".join(next(line for line in sequential.__doc__.splitlines() if "core 2 %, 10 % of pairs" in line).split())
    assert row == "core 2 %, 10 % of pairs @ 10 % 0.05 % 99.9 % 3.5 3.1"
    aa = simulate(RULE, 1.0, core=0.02, outliers=0.1, outlier_spread=0.1, decisions=10_000, seed=2)
    assert 1 <= aa.faster <= 14 and aa.faster_rate < 0.002
    gain = simulate(RULE, 1.15, core=0.02, outliers=0.1, outlier_spread=0.1, decisions=2_000, seed=2)
    assert gain.faster >= 1990 and sorted(gain.pairs)[1000] == 3
    assert 3.0 <= gain.mean_pairs < 3.2 and 3.3 < aa.mean_pairs < 3.7


# --- the aio sweep's confirmation: pairs one at a time, resumed from the journal ---------------------------

DEFAULT = SweepPoint()
WIDE = SweepPoint(block_size=1 << 20, queue_depth=32)                 # clearly faster: 2x every pair
SMALL = SweepPoint(block_size=256 << 10, queue_depth=4)               # never clear: the 6 pairs of `wide` above
SMALL_RATIOS = [1.10, 0.95, 1.25, 1.00, 1.15, 0.90]


class StepsStandIn:
    """Training steps with known optimizer-step times: the defaults 1.0 s,
    WIDE 0.5 s, SMALL 1 / SMALL_RATIOS[repeat]; stops ("Ctrl-C") at call `stop_at`."""

    name = "steps"

    def __init__(self, stop_at: int = 0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.stop_at = stop_at

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        repeat = len([c for c in self.calls if c[0] == point.key()])
        if len(self.calls) + 1 == self.stop_at:
            raise KeyboardInterrupt
        self.calls.append((point.key(), repeat))
        t = {DEFAULT.key(): 1.0, WIDE.key(): 0.5}.get(point.key())
        return Measurement(step_s=2.0, optimizer_step_s=t or 1 / SMALL_RATIOS[repeat]), {}


def confirm(tmp_path: Path, executor: StepsStandIn) -> tuple[list[Ranked], Any]:
    ranking = [Ranked(p, "fio", (s,), 0, s, 0.0, s, s) for p, s in ((WIDE, 3.0), (SMALL, 2.0), (DEFAULT, 1.0))]
    return confirm_on_steps(ranking, DEFAULT, RunSettings(), Target(tmp_path), Journal(tmp_path / "j.jsonl"),
                            steps=executor)


def test_each_finalist_runs_pairs_until_the_rule_decides(tmp_path: Path) -> None:
    steps = StepsStandIn()
    rows, gain = confirm(tmp_path, steps)
    ran = [(t.point, t.repeat) for t in Journal(tmp_path / "j.jsonl").trials]
    # rounds alternate the finalists; WIDE is decided after its 3rd pair, SMALL runs to the maximum (6)
    assert ran == [(WIDE, 0), (DEFAULT, 0), (SMALL, 0), (DEFAULT, 1), (WIDE, 1), (DEFAULT, 2), (SMALL, 1),
                   (DEFAULT, 3), (WIDE, 2), (DEFAULT, 4), (SMALL, 2), (DEFAULT, 5),
                   (SMALL, 3), (DEFAULT, 7), (SMALL, 4), (DEFAULT, 9), (SMALL, 5), (DEFAULT, 11)]
    assert gain.candidate == WIDE and gain.verdict == "faster" and gain.pairs == 3 and gain.ratios == (2.0,) * 3
    assert (gain.floor, gain.max_pairs, gain.spread_assumed) == (0.05, 6, 0.02) and gain.lower > 1.05
    assert [r.point for r in rows][0] == WIDE


def test_a_resumed_confirmation_takes_every_pair_from_the_journal(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = StepsStandIn()
    _, gain = confirm(tmp_path / "a", whole)
    with pytest.raises(KeyboardInterrupt):
        confirm(tmp_path / "b", StepsStandIn(stop_at=12))               # 11 trials journaled, then Ctrl-C
    again = StepsStandIn()
    _, resumed = confirm(tmp_path / "b", again)
    assert len(again.calls) == len(whole.calls) - 11 == 7                # the journaled 11 were not re-run
    ids = [(t.point.key(), t.repeat) for t in Journal(tmp_path / "b" / "j.jsonl").trials]
    assert ids == [(t.point.key(), t.repeat) for t in Journal(tmp_path / "a" / "j.jsonl").trials]
    assert resumed == gain
