"""The offload search's budget, its plan and what it leaves undecided, and
the records of the replay ranking, pure, with stand-in trials
(tests/sweep/test_offload_confirm.py's): --budget parsed as people write a
duration, the plan fitted to the budget in its stated order, pairs stopped
by the budget (journaled ones free), the pick between the replay's and the
fastest real-step trial, and the outcome's new keys in the schema and the
report."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.offload_plan import (PlanCosts, ReplayBatch, ReplayOutcome, ReplayRank, SearchPlan, fit_plan,
                                       undecided_pairs)
from iotune.model.offload_result import Dimension
from iotune.model.units import duration, parse_duration
from iotune.render.base import RenderOptions
from iotune.render.offload import offload_console, offload_json
from iotune.sweep.journal import Journal
from iotune.sweep.budget import (DEFAULT_BUDGET_CAP_S, DEFAULT_BUDGET_TRIALS, FLOOR_TRIALS, SearchClock,
                                         clock_for)
from iotune.sweep.offload.confirm import confirm_pairs
from iotune.sweep.offload.changes import knob_changes
from iotune.sweep.offload.search import _outcome
from iotune.sweep.offload.stages import Staged, pick, run_real
from iotune.model.offload_result import Prediction

from tests.sweep.test_offload_confirm import BASE, SHAPE, SMALL_GROUPS, StandInTrials, search
from tests.project.test_schemas import conforms, strict_json

SMALL_KEY = json.dumps(knob_changes(BASE, SMALL_GROUPS), sort_keys=True)


@pytest.mark.parametrize("text,seconds", [("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("90s", 90), ("90", 90),
                                          ("1.5h", 5400), ("10 min", 600)])
def test_a_duration_is_read_as_people_write_it(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "2m30", "1h1h", "m"])
def test_a_duration_that_is_not_one_names_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration: write it as 45m, 2h, 1h30m or 90s \(h, m or min, s\)"):
        parse_duration(text)


def test_the_budget_option_refuses_a_bad_value_and_its_help_shows_an_example() -> None:
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--budget", "soon"])
    assert r.exit_code == 2 and r.stderr.endswith(
        "Error: Invalid value for '--budget': 'soon' is not a duration: write it as 45m, 2h, 1h30m or 90s (h, m or "
        "min, s)\n"), r.stderr
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--budget", "0"])
    assert r.exit_code == 2 and "'0': give a duration above 0, e.g. 45m" in r.stderr
    help_text = " ".join(CliRunner().invoke(cli, ["sweep", "offload", "--help"]).stdout.split())
    assert ("--budget DURATION The most this run of the search may take, e.g. 45m, 2h or 1h30m (s, m, h)."
            in help_text)
    assert duration(45) == "45 s" and duration(150) == "2.5 min" and duration(9000) == "2.5 h"


def test_the_plan_fits_the_budget_in_its_order() -> None:
    """Replays first, then the first look of the pairs, then real-step trials, then more pairs."""
    costs = PlanCosts(trial_s=100.0, replay_batch_s=30.0, spent_s=150.0)
    whole = fit_plan(5000.0, "--budget", costs, replayable=3, real=4, max_pairs=6)
    assert (whole.replay_candidates, whole.real_trials, whole.max_pairs, whole.cut) == (3, 4, 6, ())
    assert whole.estimated_s == 150 + 90 + 400 + 1200
    tight = fit_plan(1100.0, "--budget", costs, replayable=3, real=4, max_pairs=6)    # 950 s left
    assert (tight.replay_candidates, tight.max_pairs, tight.real_trials) == (3, 3, 2)
    assert tight.cut == ("2 of 4 real-step candidate trials", "at most 3 confirmation pair(s), not 6")
    tiny = fit_plan(200.0, "--budget", costs, replayable=3, real=4, max_pairs=6)      # 50 s left
    assert (tiny.replay_candidates, tiny.max_pairs, tiny.real_trials) == (1, 0, 0)
    assert tiny.cut[-1] == ("at most 0 confirmation pair(s), not 6 (the rule decides from 3: the pick will stay "
                            "undecided)")
    free = fit_plan(200.0, "--budget", costs, replayable=3, real=0, max_pairs=6, journaled=2)
    assert free.replay_candidates == 3 and free.replay_s == 30.0               # the journaled two cost nothing
    lines = whole.describe()
    assert lines[0] == ("plan within 83.3 min (--budget); spent so far 2.5 min (the reference trial and the "
                        "fidelity replays)")
    assert lines[-1] == "  estimated: 30.7 min of 83.3 min"
    assert SearchPlan.from_json(json.loads(json.dumps(tight.to_json()))) == tight


def test_the_default_budget_is_trials_of_the_job_and_the_clock_says_what_did_not_fit() -> None:
    clock = clock_for(None)
    assert clock.budget_s is None and clock.fits(1e9)
    clock.default_from(40.0)
    assert clock.budget_s == DEFAULT_BUDGET_TRIALS * 40.0 == 960.0
    assert clock.source == "the default: 24 x the reference trial's 40 s"
    one_b = clock_for(None)            # a 1B trial here: 24 of them would be 100 min; the default ends within the hour
    one_b.default_from(250.0)
    assert one_b.budget_s == DEFAULT_BUDGET_CAP_S == 3600.0
    assert one_b.source == "the default: 24 x the reference trial's 4.2 min (100.0 min), capped at 60.0 min"
    huge = clock_for(None)             # trials so long that the hour holds fewer than the rule needs: it gets those
    huge.default_from(900.0)
    assert huge.budget_s == FLOOR_TRIALS * 900.0 == 6300.0
    assert huge.source == ("the default: 24 x the reference trial's 15.0 min (6.0 h), capped at 105.0 min "
                           "(7 trials: the reference trial and the 3 pairs the rule needs)")
    given = clock_for(2700.0)
    given.default_from(40.0)
    assert given.budget_s == 2700.0 and given.source == "--budget 45.0 min"
    assert not given.fits(3000.0) and given.stopped


class Trials(StandInTrials):
    base = BASE


class TrialClock(SearchClock):
    """The budget spent as the stand-in trials take it: 30 s each."""

    def __init__(self, budget_s: float, trials: StandInTrials) -> None:
        super().__init__(budget_s)
        self.trials = trials

    def spent_s(self) -> float:
        return 30.0 * self.trials.ran


def test_the_budget_stops_the_pairs_and_a_journaled_pair_costs_nothing(tmp_path: Path) -> None:
    trials = Trials(tmp_path, [1.08] * 6)
    clock = TrialClock(130.0, trials)                # two pairs of 60 s fit, not three
    c = confirm_pairs(SMALL_GROUPS, BASE, SHAPE, trials, search(), clock, None, 60.0)    # type: ignore[arg-type]
    assert (c.verdict, len(c.ratios), c.stopped, clock.stopped) == ("undecided", 2, "budget", True)
    assert c.rule is not None and c.rule.more_pairs_needed == 3 and c.more_s == 3 * 60.0
    again = Trials(tmp_path, [1.08] * 6)
    resumed = confirm_pairs(SMALL_GROUPS, BASE, SHAPE, again, search(),     # type: ignore[arg-type]
                            TrialClock(0.5, again), None, 60.0)
    assert again.calls == [] and resumed.ratios == c.ratios and resumed.stopped == "budget"
    (tmp_path / "x").mkdir()
    capped = confirm_pairs(SMALL_GROUPS, BASE, SHAPE, Trials(tmp_path / "x", [1.08] * 6),   # type: ignore[arg-type]
                           search(), None, 1, 60.0)
    assert len(capped.ratios) == 1 and capped.stopped == "budget"                         # the plan's one pair


def test_real_step_trials_stop_at_the_plan_and_say_so() -> None:
    plan = replace(fit_plan(1000.0, "--budget", PlanCosts(100.0, 0.0, 0.0), 0, 3, 3), real_trials=1)
    clock = SearchClock(1000.0)
    preds = [Prediction(f"k{i}", {"zero_optimization.sub_group_size": i}, 1.0, True) for i in range(3)]
    ran = run_real(preds, plan, clock, lambda p: p.key,     # type: ignore[arg-type,return-value]
                   lambda p: p.key == "k2")
    assert ran == ["k0", "k2"] and clock.stopped                                   # k2 is journaled: free
    assert clock.undecided == ["undecided: sub_group_size=1 vs your config: not run on real steps (≈ 100 s)"]
    assert undecided_pairs("sub_group_size=8", 3, 0.0, least=True) == \
        "undecided: sub_group_size=8 vs your config: at least 3 more pairs"


def rank(key: str, seconds: float, verdict: str) -> ReplayRank:
    return ReplayRank(key, json.loads(key), (seconds, seconds * 1.02, seconds * 0.99), (2.0, 2.01, 1.99), verdict)


def test_the_pick_is_the_replays_unless_a_real_step_trial_is_faster() -> None:
    fast = rank(SMALL_KEY, 1.0, "faster")
    replay = ReplayOutcome(True, "ok", 1.0, 1.0, (fast,), fast.key)
    assert pick(replay, None, 10.0) == (fast.key, "replay")
    from iotune.model.offload_result import OffloadTrial
    quick = OffloadTrial("real", {}, "ok", step_s=8.5)
    slow = replace(quick, step_s=9.5)
    assert pick(replay, quick, 10.0) == ("real", "real steps")       # 10 - (2 - 1) = 9 s estimated: 8.5 is faster
    assert pick(replay, slow, 10.0) == (fast.key, "replay")
    assert pick(replace(replay, pick=""), None, 10.0) == ("", "")
    assert ReplayOutcome.from_json(json.loads(json.dumps(replay.to_json()))) == replay
    assert fast.median_s == 1.0 and fast.ratio == 2.0 and fast.spread == pytest.approx(0.03)


def test_an_outcome_with_replays_a_plan_and_a_budget_stop_conforms_and_reads(tmp_path: Path) -> None:
    trials = Trials(tmp_path, [1.3] * 6)
    ref = trials.run(BASE, "reference")
    replay = ReplayOutcome(True, "your config's traced step replays at 1.004 of its time", 1.004, 0.998,
                           (rank(SMALL_KEY, 1.0, "faster"),), SMALL_KEY,
                           (("pipeline_read=True", "pipelining: DeepSpeed's pipelined swapper overlaps ..."),))
    plan = fit_plan(100.0, "--budget 100 s", PlanCosts(30.0, 10.0, 40.0), 1, 0, 6)
    clock = SearchClock(100.0, "--budget 100 s")
    searched = [Dimension("zero_optimization.sub_group_size", (8_000_000,))]
    o = _outcome(search(), BASE, SHAPE, searched, [], [], trials, (), BASE, [],   # type: ignore[arg-type]
                 (ref, [], {SMALL_KEY: SMALL_GROUPS}), Staged(replay, plan, clock))
    assert (o.picked_by, o.picked, o.stopped, o.verdict) == ("replay", {"zero_optimization.sub_group_size":
                                                                        8_000_000}, "budget", "none")
    assert o.undecided == ("undecided: sub_group_size=8000000 vs your config: at least 3 more pairs (≈ 3 min)",)
    assert o.compared and o.best is None
    conforms("sweep-offload-3", strict_json(offload_json(o, RenderOptions())))
    text = offload_console(o, RenderOptions())
    for line in ["  plan within 100 s (--budget 100 s); spent so far 40 s (the reference trial and the fidelity "
                 "replays)", "  Replays: your config's traced step replays at 1.004 of its time",
                 "  real steps instead: pipeline_read=True: pipelining: DeepSpeed's pipelined swapper overlaps ...",
                 "  the budget stopped the search:", f"  {o.undecided[0]}",
                 "Keeping your config: the budget left no time for the pairs"]:
        assert line in text, (line, text)
    [row] = [r for r in text.splitlines() if r.startswith("  sub_group_size=8000000 ")]
    assert row.split()[1:] == ["1.000", "3.0%", "3", "2.000x", "faster", "<-", "the", "pick"]


def test_the_journal_keeps_replays_and_older_journals_still_load(tmp_path: Path) -> None:
    from iotune.model.offload_schedule import ReplayBase
    from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule

    j = Journal(tmp_path / "journal.jsonl")
    base = ReplayBase(SwapSchedule((SwapGroup((SwapOp("read", "a.swp", 4096),)),), 1, 0.1, 0.1), 0.2, 0.001)
    j.record_replay_base("{}", base)
    j.record_replay(ReplayBatch("k", 0, (1, 0, 0, 1), (1.0, 2.0, 2.0, 1.0), 9.0))
    again = Journal(tmp_path / "journal.jsonl")
    assert again.find_replay_base("{}") == base and again.find_replay("k", 0) == j.offload_replays[0]
    assert again.find_replay("k", 3) is None and again.offload_replays[0].of(1) == (1.0, 1.0)
    (tmp_path / "old.jsonl").write_text('{"kind":"header","version":1,"env":{"mode":"offload"}}\n'
                                        '{"kind":"offload-trial","key":"{}","changes":{},"status":"ok"}\n')
    old = Journal(tmp_path / "old.jsonl")
    assert old.offload_replays == [] and old.replay_bases == [] and len(old.offload_trials) == 1


def test_replayable_candidates_the_budget_cannot_rank_are_left_undecided(tmp_path: Path) -> None:
    """A plan with no room for replays ranks nothing: each candidate is undecided, at its cost."""
    from iotune.sweep.executor import Target
    from iotune.sweep.offload.replay_rank import Replays, split
    from iotune.sweep.offload.stages import ReplayStage, rank

    from tests.model.test_offload_schedule import NVME, TINY, traced

    rp = Replays(traced("tiny-1e9"), NVME, TINY, {}, Target(tmp_path), Journal(tmp_path / "j.jsonl"), print)
    derived, rest = split(rp, [(json.dumps({"zero_optimization.sub_group_size": n}),
                                replace(NVME, sub_group_size=n)) for n in (461_088, 922_176)] +
                          [("{}", replace(NVME, pipeline_read=True, optimizer_buffer_count=8))])
    assert [k for k, _, _ in derived] == ['{"zero_optimization.sub_group_size": 461088}',
                                          '{"zero_optimization.sub_group_size": 922176}']
    assert rest == [("{}", "pipelining: DeepSpeed's pipelined swapper overlaps a read handle and a write handle, "
                           "which the replay (one handle) does not represent")]
    stage = ReplayStage(ReplayOutcome(True, "ok"), rp, tuple(derived), 40.0)
    plan = fit_plan(10.0, "--budget 10 s", PlanCosts(30.0, 40.0, 0.0), 2, 0, 6)
    clock = SearchClock(10.0)
    o = rank(stage, plan, clock)
    assert o.ranked == () and o.pick == "" and clock.stopped
    assert clock.undecided == [f"undecided: sub_group_size={n} vs your config: not ranked on replays (≈ 40 s)"
                               for n in (461088, 922176)]
