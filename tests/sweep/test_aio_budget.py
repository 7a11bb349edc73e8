"""The aio sweep's budget (`iotune sweep aio --budget`), with the stand-ins of
tests/sweep/test_aio_replay.py and test_sequential.py on a stand-in clock
(each training-step trial takes 60 s of it, each replay 2 s): the plan fitted
in its stated order with its exact words, the default from the first trial
with the aio search added, replays, pairs and thread trials stopped by the
budget (journaled ones free), the defaults kept when the budget stopped the
steps, and the outcome's new keys in the schema and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.aio_plan import AioPlan, fit_aio_plan
from iotune.model.sweep import Measurement, SweepPoint
from iotune.model.sweep_result import Ranked, SweepOutcome, more_pairs_phrase
from iotune.render.registry import render
from iotune.sweep.aio.budget import AioBudget
from iotune.sweep.aio.command import SweepArgs
from iotune.sweep.aio.confirm import confirm_on_steps
from iotune.sweep.aio.fleet import remote_sweep_argv
from iotune.sweep.aio.threads import sweep_threads
from iotune.sweep.budget import SearchClock
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.space import RunSettings

from tests.project.test_schemas import conforms, strict_json
from tests.sweep import test_aio_replay as replay
from tests.sweep.test_sequential import DEFAULT, SMALL, WIDE, StepsStandIn

TRIAL_S, REPLAY_S = 60.0, 2.0


class StandInTime:
    """The clock the budget, the trials and the replays read: it moves only when a stand-in works."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock_time(monkeypatch: pytest.MonkeyPatch) -> StandInTime:
    t = StandInTime()
    for module in ("iotune.sweep.budget", "iotune.sweep.measure", "iotune.sweep.replay_pairs"):
        monkeypatch.setattr(f"{module}.time", t)
    return t


def test_the_plan_fits_the_budget_in_its_order() -> None:
    # 900 s left: both finalists' first looks (2 x 50 s), 3 pairs of 2 x 60 s, both thread trials, then 2 of the 3
    # further pairs
    plan = fit_aio_plan(1000.0, "--budget 16.7 min", 60.0, 100.0, 2, 50.0, 1, 6, 2)
    assert (plan.replay_candidates, plan.max_pairs, plan.thread_trials) == (2, 5, 2)
    assert plan.estimated_s == 100 + 100 + 5 * 120 + 120
    assert plan.describe() == [
        "plan within 16.7 min (--budget 16.7 min); spent so far 100 s (the aio search, the first training-step "
        "trial and the fidelity replays)",
        "  replays: 2 finalist(s) ranked against DeepSpeed's defaults, at least 3 ABBA pairs of replays each (≈ 100 s)",
        "  training steps: at most 5 pair(s) with DeepSpeed's defaults for each of 1 candidate(s) (≈ 10.0 min) at "
        "60 s a trial",
        "  CPU-optimizer threads: 2 trial(s) (≈ 2.0 min)",
        "  estimated: 15.3 min of 16.7 min",
        "  cut to fit the budget: at most 5 confirmation pair(s) each, not 6"]
    tight = fit_aio_plan(300.0, "--budget 5.0 min", 60.0, 100.0, 2, 150.0, 2, 6, 2)
    assert (tight.replay_candidates, tight.max_pairs, tight.thread_trials) == (1, 0, 0)
    assert tight.cut == ("1 of 2 finalists ranked on replays",
                         "at most 0 confirmation pair(s) each, not 6 (the rule decides from 3: the sweep will stay "
                         "undecided)", "0 of 2 thread-table trials")
    assert AioPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_the_default_is_the_aio_search_and_24_trials_at_most_an_hour(clock_time: StandInTime) -> None:
    budget = AioBudget(SearchClock(), 6, 0)
    clock_time.advance(200.0 + 250.0)                    # the aio search, then a 1B recording run
    budget.timed(250.0, "the recording run")
    assert budget.clock.budget_s == 3600.0
    assert budget.clock.source == ("the default: the aio search's 3.3 min + 24 x the recording run's 4.2 min "
                                   "(103.3 min), capped at 60.0 min")
    small = AioBudget(SearchClock(), 6, 0)
    clock_time.advance(30.0)
    small.timed(30.0, "the first training-step trial")
    small.timed(90.0, "a later trial")                   # the first trial sets it
    assert (small.clock.budget_s, small.trial_s) == (24 * 30.0, 30.0)
    assert small.clock.source == "the default: 24 x the first training-step trial's 30 s"


class TimedSteps(StepsStandIn):
    """test_sequential's training steps (WIDE 2x the defaults, SMALL never clear), each TRIAL_S of the clock."""

    def __init__(self, t: StandInTime) -> None:
        super().__init__()
        self.t = t

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        self.t.advance(TRIAL_S)
        return super().run(point, target)


def confirm_small(tmp_path: Path, steps: StepsStandIn, budget: AioBudget) -> Any:
    say = budget.say
    ranking = [Ranked(p, "fio", (s,), 0, s, 0.0, s, s) for p, s in ((SMALL, 2.0), (DEFAULT, 1.0))]
    return confirm_on_steps(ranking, DEFAULT, RunSettings(), Target(tmp_path), Journal(tmp_path / "j.jsonl"),
                            say=say, steps=steps, candidates=[SMALL], budget=budget)


def test_the_budget_stops_the_pairs_says_what_deciding_takes_and_a_journaled_pair_is_free(
        tmp_path: Path, clock_time: StandInTime) -> None:
    said: list[str] = []
    budget = AioBudget(SearchClock(600.0, "--budget 10.0 min"), 6, 0, said.append)
    budget.timed(TRIAL_S, "the recording run")
    steps = TimedSteps(clock_time)
    _, gain = confirm_small(tmp_path, steps, budget)
    # 600 s hold 5 pairs of 2 x 60 s: the plan says so, and the sixth is not run
    assert budget.plan is not None and budget.plan.max_pairs == 5 and len(steps.calls) == 10
    assert said[0].startswith("plan within 10.0 min (--budget 10.0 min)")
    assert gain.verdict == "undecided" and gain.pairs == 5 and budget.stopped() == "budget"
    assert any(line.endswith("; the budget stopped its pairs") for line in said)
    assert gain.more_pairs == 261 and budget.clock.undecided == [
        f"undecided: {SMALL.label()} vs DeepSpeed's defaults: about 261 more pairs (≈ 8.7 h)"]
    # the same command again, with no time left: the 5 pairs come from the journal, none runs
    again = TimedSteps(clock_time)
    resumed = AioBudget(SearchClock(1.0, "--budget 1 s"), 6, 0)
    resumed.timed(TRIAL_S, "the recording run")
    _, gain2 = confirm_small(tmp_path, again, resumed)
    assert again.calls == [] and gain2.ratios == gain.ratios and resumed.stopped() == "budget"


def test_the_thread_table_runs_the_trials_that_fit(tmp_path: Path, clock_time: StandInTime) -> None:
    said: list[str] = []
    budget = AioBudget(SearchClock(90.0, "--budget 90 s"), 6, 3, said.append)
    budget.timed(TRIAL_S, "the first training-step trial")
    steps = TimedSteps(clock_time)
    rows = sweep_threads(WIDE, (1, 2, 4), steps, Target(tmp_path), Journal(tmp_path / "j.jsonl"), say=said.append,
                         budget=budget)
    assert [r.point.omp_threads for r in rows] == [1] and len(steps.calls) == 1
    assert budget.clock.undecided == ["not measured: OMP_NUM_THREADS=2 in the thread table (≈ 60 s)",
                                      "not measured: OMP_NUM_THREADS=4 in the thread table (≈ 60 s)"]
    assert "OMP_NUM_THREADS=2 not measured: the budget has no room for its trial (≈ 60 s)" in said[-2]


class TimedJob(replay.Job):
    def __init__(self, t: StandInTime) -> None:
        super().__init__()
        self.t = t

    def run(self, point: SweepPoint, target: Target, record_schedule: bool = False) -> Any:
        self.t.advance(TRIAL_S)
        return super().run(point, target, record_schedule)


class TimedReplayer(replay.Replayer):
    def __init__(self, t: StandInTime) -> None:
        super().__init__()
        self.t = t

    def __call__(self, entries: Any, order: Any, target: Target, **kw: Any) -> Any:
        self.t.advance(REPLAY_S * len(order))
        return super().__call__(entries, order, target, **kw)


def test_a_sweep_whose_budget_holds_two_pairs_keeps_the_defaults_and_says_what_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_time: StandInTime) -> None:
    # spent before the plan: the recording run (60 s) and the fidelity replays (3 x 2 s); a finalist's first
    # look is 6 replays (12 s); 400 s then hold both first looks and 2 pairs (2 x 60 s each) of the pick
    job = TimedJob(clock_time)
    outcome, said = replay.sweep(tmp_path, monkeypatch, job, TimedReplayer(clock_time), budget_s=400.0)
    plan = outcome.plan
    assert plan is not None and (plan.spent_s, plan.replay_candidates, plan.confirming, plan.max_pairs) == \
        (66.0, 2, 1, 2)
    assert plan.cut == ("at most 2 confirmation pair(s) each, not 3 (the rule decides from 3: the sweep will stay "
                        "undecided)",)
    assert plan.describe()[1:3] == [
        "  replays: 2 finalist(s) ranked against DeepSpeed's defaults, at least 3 ABBA pairs of replays each (≈ 24 s)",
        "  training steps: at most 2 pair(s) with DeepSpeed's defaults for each of 1 candidate(s) (≈ 4.0 min) at "
        "60 s a trial"]
    assert outcome.replay is not None and outcome.replay.pick == replay.WIDE
    pairs = [t for t in replay.trials(tmp_path) if t.repeat >= 0]
    assert len(pairs) == 4 and outcome.stopped == "budget"
    assert outcome.step_gain is not None and outcome.step_gain.verdict == "undecided"
    assert outcome.recommended == replay.DEFAULT
    assert outcome.undecided == (f"undecided: {replay.WIDE.label()} vs DeepSpeed's defaults: about 1 more pair "
                                 f"(≈ 2 min)",)           # at its pairs' own time: 2 x 60 s
    assert more_pairs_phrase(1, 31.0) == "about 1 more pair (≈ 31 s)"
    assert any(s.startswith("plan within 6.7 min (--budget 6.7 min)") for s in said)
    text = render(outcome, "console")
    assert "the budget stopped the sweep (6.7 min: --budget 6.7 min)" in text
    assert f"    undecided: {replay.WIDE.label()} vs DeepSpeed's defaults" in text
    doc = strict_json(render(outcome, "json"))
    conforms("sweep-2", doc)
    assert SweepOutcome.from_json(doc).plan == plan and doc["stopped"] == "budget"


def test_a_finalist_the_plan_has_no_room_for_is_left_unranked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_time: StandInTime) -> None:
    job = TimedJob(clock_time)
    outcome, said = replay.sweep(tmp_path, monkeypatch, job, TimedReplayer(clock_time), budget_s=66.0 + 12.0 + 1.0)
    assert outcome.plan is not None and outcome.plan.replay_candidates == 1
    rp = outcome.replay
    assert rp is not None and [r.point for r in rp.rows if r.point != replay.DEFAULT] == [replay.WIDE]
    assert outcome.recommended == replay.DEFAULT and outcome.stopped == "budget"
    assert f"undecided: {replay.SMALL.label()} vs DeepSpeed's defaults: not ranked on replays (≈ 12 s)" in \
        outcome.undecided
    assert f"replayed {replay.SMALL.label()}: the budget's plan holds the replays of 1 finalist(s) only, left " \
           f"unranked" in said
    assert not [t for t in replay.trials(tmp_path) if t.repeat >= 0]       # no pair fits: none ran


def test_the_budget_option_is_for_training_steps_and_goes_to_every_node(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["sweep", "aio", "--path", str(tmp_path), "--confirm", "0", "--budget", "45m"])
    assert r.exit_code == 2 and "--budget sets the training-step trials, and this sweep runs none" in r.output
    r = CliRunner().invoke(cli, ["sweep", "aio", "--budget", "soon"])
    assert r.exit_code == 2 and "'soon' is not a duration: write it as 45m, 2h, 1h30m or 90s" in r.output
    assert "--budget DURATION" in CliRunner().invoke(cli, ["sweep", "aio", "--help"]).output
    argv = remote_sweep_argv(SweepArgs(target_dir=tmp_path, budget_s=2700.0), "iotune", tmp_path / "j")
    assert argv[argv.index("--budget") + 1] == "2700.000s"


def test_without_a_replay_the_default_comes_from_the_first_pairs_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_time: StandInTime) -> None:
    job = TimedJob(clock_time)
    outcome, said = replay.sweep(tmp_path, monkeypatch, job, profile=replay.PROFILE.replace("replay_pairs = 4",
                                                                                             "replay_pairs = 0"),
                                 budget_s=None)
    plan = outcome.plan
    # 24 x 60 s from the first trial on: both finalists' 3 pairs (12 trials) fit, nothing is cut
    assert plan is not None and plan.budget_source == "the default: 24 x the first training-step trial's 60 s"
    assert (plan.budget_s, plan.spent_s, plan.confirming, plan.max_pairs, plan.cut) == (1440.0, 60.0, 2, 3, ())
    assert outcome.stopped == "" and outcome.undecided == () and outcome.replay is None
    assert said.index(plan.describe()[0]) > said.index(next(s for s in said if s.startswith("confirming 2")))


def test_more_replay_looks_never_eat_the_time_the_plan_keeps_for_the_pairs(clock_time: StandInTime) -> None:
    budget = AioBudget(SearchClock(400.0, "--budget 6.7 min"), 3, 0)
    budget.timed(TRIAL_S, "the recording run")
    clock_time.advance(66.0)
    plan = budget.make_plan(2, 12.0, 1)             # replays 24 s, then 2 pairs of 2 x 60 s (240 s) are kept
    assert plan is not None and (plan.replay_s, plan.pairs_s) == (24.0, 240.0)
    clock_time.advance(75.0)                         # 259 s left: 3 more pairs of replays (12 s) + 240 s fit
    assert budget.replay_fits(3) and not budget.clock.stopped
    clock_time.advance(10.0)                         # 249 s left: they would eat the pairs' time
    assert not budget.replay_fits(3) and budget.stopped() == "budget"
