"""The aio sweep ranking its finalists on the replay of the job's own swap
I/O (iotune.sweep.aio.replay_rank), with stand-ins for the slow parts: a
measure stage with known scores, a training job with known step times that
records a known schedule, and a replayer with known seconds per setting.
What is checked is the flow: the recording run at the defaults and its
schedule in the journal, the fidelity check and its fallback, replay pairs
in ABBA order decided by the confirmation rule, only the replay's pick on
real steps, the journal (resumed) and the report."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from iotune.errors import UsageError
from iotune.model.aio import AioSettings
from iotune.model.aio_replay import ReplayRanking
from iotune.model.journal import read_journal
from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule
from iotune.model.replay_result import ReplayResult
from iotune.model.sweep import Measurement, SweepPoint, Trial
from iotune.model.sweep_result import Progress, SweepOutcome
from iotune.render.progress import trial_line
from iotune.render.registry import render
from iotune.resources import schema_path
from iotune.sweep.aio.command import SweepArgs, build_profile
from iotune.sweep.aio.pipeline import SweepRequest, run_sweep
from iotune.sweep.aio.replay_rank import (FIDELITY_KEY, PAIRS_KEY, TRACE_REPEAT, Stage, defaults_entry,
                                         replay_finalist)
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.sequential import SequentialRule

MiB = 1 << 20
DEFAULT = SweepPoint()                                          # DeepSpeed's aio defaults: 1M, qd 8
WIDE = SweepPoint(queue_depth=32)                               # the best on every measure
SMALL = SweepPoint(block_size=256 << 10, queue_depth=32)        # second by the benchmark, slower on the replay
BENCH = {DEFAULT.key(): 200e6, WIDE.key(): 300e6, SMALL.key(): 250e6,
         SweepPoint(block_size=256 << 10).key(): 100e6}
REPLAY_S = {DEFAULT.key(): 1.0, WIDE.key(): 0.6, SMALL.key(): 1.3}     # seconds of one replayed step
ABBA = (1, 0, 0, 1, 1, 0)              # 3 pairs: candidate (1) first in pairs 0 and 2, the defaults (0) in pair 1
PROFILE = ('[space]\nblock_size = ["256K", "1M"]\nqueue_depth = [8, 32]\nintra_op_parallelism = [1]\n'
           'single_submit = [false]\noverlap_events = [true]\n'
           '[run]\nsearch = "grid"\nrepeats = 1\nconfirm_top = 2\nconfirm_pairs = 3\nreplay_pairs = 4\nsteps = 3\n')


def schedule(traced_s: float = 1.0) -> SwapSchedule:
    ops = tuple(SwapOp(d, f"zero_stage_3/optimizer/rank0/{n}.swp", 4 * MiB) for d in ("read", "write")
                for n in ("a", "b"))
    return SwapSchedule((SwapGroup(ops[:2], wait_s=0.4), SwapGroup(ops[2:], gap_s=0.1, wait_s=0.4)),
                        step=1, optimizer_s=traced_s, traced_s=traced_s)


def key_of(aio: AioSettings) -> str:
    return SweepPoint(aio.block_size, aio.queue_depth, aio.intra_op_parallelism, aio.single_submit,
                      aio.overlap_events).key()


class Bench:
    """The measure stage: each point's known bandwidth."""

    name = "fio"

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        bw = BENCH[point.key()]
        return Measurement(read_bytes_per_s=bw, write_bytes_per_s=bw), {}


class Job:
    """The user's job: known optimizer-step times (`ratios[i]`: the defaults' time over WIDE's in
    its i-th trial), and with record_schedule the known schedule traced at `traced_s`."""

    name = "cmd"
    what = "optimizer steps each of `train.py`"

    def __init__(self, traced_s: float = 1.0, ratios: tuple[float, ...] = (1.5,) * 6) -> None:
        self.traced_s, self.ratios = traced_s, ratios
        self.calls: list[tuple[str, bool]] = []

    def run(self, point: SweepPoint, target: Target,
            record_schedule: bool = False) -> tuple[Measurement, dict[str, Any]]:
        done = sum(1 for k, _ in self.calls if k == point.key())
        self.calls.append((point.key(), record_schedule))
        raw = {"schedule": schedule(self.traced_s).to_json()} if record_schedule else {}
        t = 1.0 if point.key() == DEFAULT.key() else 1 / self.ratios[min(done, len(self.ratios) - 1)]
        if point.key() == SMALL.key():
            t = 1.1
        return Measurement(step_s=t + 0.5, optimizer_step_s=t), raw


class Replayer:
    """run_replay_plan with each setting's known seconds (±0.2 % alternating, as a quiet drive)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], tuple[int, ...]]] = []

    def __call__(self, entries: Sequence[tuple[SwapSchedule, AioSettings]], order: Sequence[int],
                 target: Target, **kw: Any) -> tuple[tuple[int, ReplayResult], ...]:
        self.calls.append((tuple(key_of(aio) for _, aio in entries), tuple(order)))
        out = []
        for n, i in enumerate(order):
            s, aio = entries[i]
            seconds = REPLAY_S[key_of(aio)] * (1.002 if n % 2 == 0 else 0.998)
            out.append((i, ReplayResult(seconds, s.read_bytes, s.write_bytes, s.read_bytes, s.write_bytes, (), aio,
                                        True)))
        return tuple(out)


def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Job, replayer: Replayer | None = None,
          profile: str = PROFILE, budget_s: float | None = 3600.0) -> tuple[SweepOutcome, list[str]]:
    """The sweep with the stand-ins (their trials take no time, so the default budget, 24 of them, would be
    none: an hour unless `budget_s` says otherwise)."""
    monkeypatch.setattr("iotune.sweep.replay_pairs.run_replay_plan", replayer or Replayer())
    monkeypatch.setattr("iotune.sweep.aio.pipeline.EXECUTORS", {"fio": Bench})
    monkeypatch.setattr("iotune.sweep.aio.pipeline.training_steps", lambda req, target, say: job)
    (tmp_path / "p.toml").write_text(profile)
    (tmp_path / "drive").mkdir(exist_ok=True)
    prof = build_profile(SweepArgs(target_dir=tmp_path / "drive", profile=str(tmp_path / "p.toml")))
    said: list[str] = []
    req = SweepRequest(profile=prof, out_dir=tmp_path / "j", validate=False, budget_s=budget_s)
    return run_sweep(req, Target(tmp_path / "drive"), say=said.append), said


def trials(tmp_path: Path, executor: str = "cmd") -> list[Trial]:
    return [t for t in read_journal(tmp_path / "j" / "journal.jsonl").trials if t.executor == executor]


def test_the_finalists_are_ranked_on_the_replay_and_only_its_pick_runs_real_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, replayer = Job(), Replayer()
    outcome, said = sweep(tmp_path, monkeypatch, job, replayer)
    # the recording run: the first real-step trial, at the defaults; its schedule whole in its journal record
    assert job.calls[0] == (DEFAULT.key(), True) and not any(rec for _, rec in job.calls[1:])
    [recording] = [t for t in trials(tmp_path) if t.repeat == TRACE_REPEAT]
    assert recording.point == DEFAULT and SwapSchedule.from_json(recording.raw["schedule"]) == schedule()
    # the fidelity check (3 replays of the defaults in one child), then each finalist against the defaults in
    # one child of 3 ABBA pairs (the rule decides both at its first look), each journaled
    assert replayer.calls == [((DEFAULT.key(),), (0, 0, 0)), ((DEFAULT.key(), WIDE.key()), ABBA),
                              ((DEFAULT.key(), SMALL.key()), ABBA)]
    batches = read_journal(tmp_path / "j" / "journal.jsonl").offload_replays
    assert [(b.key, b.batch, b.order) for b in batches] == [(FIDELITY_KEY, 0, (0, 0, 0)),
                                                            (PAIRS_KEY + WIDE.key(), 0, ABBA),
                                                            (PAIRS_KEY + SMALL.key(), 0, ABBA)]
    rp = outcome.replay
    assert rp is not None and rp.ranked and rp.pick == WIDE and rp.fidelity is not None
    assert rp.fidelity.replay_s == pytest.approx(1.002)
    assert [(r.point, r.verdict, r.runs, r.pairs) for r in rp.rows] == [(WIDE, "faster", 3, 3), (DEFAULT, "", 6, 0),
                                                                        (SMALL, "slower", 3, 3)]
    assert rp.rows[0].ratio == pytest.approx(1 / 0.6, rel=0.01) and rp.rows[0].lower > 1.05
    assert rp.schedule is not None and (rp.schedule.step, rp.schedule.groups) == (1, 2)
    # only the pick ran real steps, in pairs with the defaults; the real steps made it the recommendation
    real = [(t.point, t.repeat) for t in trials(tmp_path)]
    assert real == [(DEFAULT, TRACE_REPEAT), (WIDE, 0), (DEFAULT, 0), (DEFAULT, 1), (WIDE, 1), (WIDE, 2),
                    (DEFAULT, 2)]
    assert outcome.step_gain is not None and outcome.step_gain.verdict == "faster"
    assert outcome.recommended == WIDE and [len(r.scores) for r in outcome.confirmed] == [3, 3]
    assert ("replay: the replay of your config took 1.002 s against the traced 1.000 s: off by 0.2 %, within 5 %, "
            "so candidates are ranked on the replay of your job's own swap I/O (step 1: 8.4 MB read and 8.4 MB "
            "written in 2 waits, traced 1.000 s)") in said
    text = " ".join(render(outcome, "console").split())
    assert "Ranked on the replay of your job's own swap I/O (step 1:" in text
    assert ("the ranking came from the replay of your job's own I/O: the replay's pick, 1 MiB blocks at queue depth "
            "32 with 1 thread (1.66× the defaults' speed, at least 1.58× by the rule), runs real steps against "
            "DeepSpeed's defaults to confirm it") in text
    page = render(outcome, "html")
    assert "Ranking on the replay of your job&#x27;s swap I/O" in page and "The replay&#x27;s pick, 1 MiB" in page
    # resumed: the schedule, the fidelity check and every pair come from the journal
    job2, replayer2 = Job(), Replayer()
    again, _ = sweep(tmp_path, monkeypatch, job2, replayer2)
    assert job2.calls == [] and replayer2.calls == []
    assert again.replay == outcome.replay and again.recommended == WIDE


def test_undecided_on_real_steps_keeps_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay finds WIDE faster; its real steps, noisy, neither clear nor exclude the floor in 3 pairs."""
    outcome, _ = sweep(tmp_path, monkeypatch, Job(ratios=(1.30, 0.95, 1.20)))
    assert outcome.replay is not None and outcome.replay.pick == WIDE
    g = outcome.step_gain
    assert g is not None and (g.verdict, g.pairs) == ("undecided", 3) and g.more_pairs > 0
    assert outcome.recommended == DEFAULT
    assert g.sentence().endswith("; keeping DeepSpeed's defaults")


def test_a_replay_off_the_traced_step_falls_back_to_real_steps_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The traced step took 1.3 s, the replay of the same schedule at the same settings 1.0 s: the replay
    does not reproduce the job, so both finalists run real steps as without a replay."""
    replayer = Replayer()
    outcome, said = sweep(tmp_path, monkeypatch, Job(traced_s=1.3), replayer)
    sentence = ("the replay of your config took 1.002 s against the traced 1.300 s: off by 22.9 %, so candidates "
                "run on real steps")
    assert f"replay: {sentence}" in said
    rp = outcome.replay
    assert rp is not None and not rp.ranked and rp.fallback == sentence and rp.pick is None and rp.rows == ()
    assert replayer.calls == [((DEFAULT.key(),), (0, 0, 0))]                # the fidelity check only
    assert {t.point for t in trials(tmp_path) if t.repeat >= 0} == {DEFAULT, WIDE, SMALL}
    assert outcome.step_gain is not None and outcome.step_gain.candidate == WIDE
    assert f"Not ranked on the replay of your job's swap I/O: {sentence}." in " ".join(render(outcome, "console").split())


def test_no_candidate_faster_on_the_replay_runs_no_real_pairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REPLAY_S, WIDE.key(), 1.01)          # within the noise of the defaults
    job = Job()
    outcome, said = sweep(tmp_path, monkeypatch, job)
    assert job.calls == [(DEFAULT.key(), True)]             # the recording run only
    rp = outcome.replay
    assert rp is not None and rp.ranked and rp.pick is None
    assert {r.point: r.verdict for r in rp.rows} == {WIDE: "within noise", DEFAULT: "", SMALL: "slower"}
    assert outcome.recommended == DEFAULT and outcome.step_gain is None and outcome.confirmed == []
    line = ("no candidate beat DeepSpeed's defaults on the replay of your job's own swap I/O, so no real steps were "
            "needed: DeepSpeed's defaults are kept")
    assert f"replay: {line}" in said and f"replay: {line}" in " ".join(render(outcome, "console").split())


def test_a_job_of_several_ranks_is_not_ranked_on_one_ranks_replay(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    class TwoRanks(Job):
        def run(self, point: SweepPoint, target: Target,
                record_schedule: bool = False) -> tuple[Measurement, dict[str, Any]]:
            m, raw = super().run(point, target, record_schedule)
            return m, {**raw, "ranks": [0, 1]}

    replayer = Replayer()
    outcome, _ = sweep(tmp_path, monkeypatch, TwoRanks(), replayer)
    assert replayer.calls == [] and outcome.replay is not None
    assert outcome.replay.fallback == ("your job ran 2 ranks, and the replay replays one rank's swap I/O, not theirs "
                                       "together on the drive, so candidates run on real steps")


def test_without_a_replay_stage_every_finalist_runs_real_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """replay_pairs 0 (--replay-pairs 0): no recording run, no replay; the finalists on real steps as before."""
    job = Job()
    outcome, _ = sweep(tmp_path, monkeypatch, job, profile=PROFILE.replace("replay_pairs = 4", "replay_pairs = 0"))
    assert outcome.replay is None and not any(rec for _, rec in job.calls)
    assert {t.point for t in trials(tmp_path)} == {DEFAULT, WIDE, SMALL}
    assert json.loads(render(outcome, "json"))["replay"] is None


def test_too_few_replay_pairs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PROFILE.replace("replay_pairs = 4", "replay_pairs = 2"))
    with pytest.raises(UsageError) as info:
        build_profile(SweepArgs(target_dir=tmp_path, profile=str(tmp_path / "p.toml")))
    assert str(info.value) == ("--replay-pairs 2 (replay_pairs in profile p): the confirmation rule decides from 3 "
                               "pairs, so fewer never rank a candidate on the replay: give 3 or more, or 0 to run "
                               "every candidate on real steps")


def closed_schema() -> dict[str, Any]:
    """sweep-2 with no key beyond those it describes."""
    text = schema_path("sweep-2").read_text()
    return dict(json.loads(text.replace('"properties": {', '"additionalProperties": false, "properties": {')))


def test_the_json_report_describes_the_replay_in_its_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, _ = sweep(tmp_path, monkeypatch, Job())
    doc = json.loads(render(outcome, "json"))
    schema = json.loads(schema_path("sweep-2").read_text())
    assert [e.message for e in Draft202012Validator(closed_schema()).iter_errors(doc)] == []
    assert set(doc["replay"]) == set(schema["$defs"]["aio_replay"]["properties"])
    assert set(doc["replay"]["rows"][0]) == set(schema["$defs"]["replay_row"]["properties"])
    assert set(doc["replay"]["schedule"]) == set(schema["$defs"]["recorded_schedule"]["properties"])
    assert doc["replay"]["pick"] == WIDE.to_json() and doc["replay"]["ranked"] is True
    assert SweepOutcome.from_json(doc).replay == outcome.replay == ReplayRanking.from_json(doc["replay"])


def test_progress_names_the_recording_run() -> None:
    recording = Trial("cmd", DEFAULT, TRACE_REPEAT, "ok", Measurement(step_s=1.5, optimizer_step_s=1.0))
    assert trial_line(Progress(1, 9, recording), None) == \
        "[1/9] cmd bs=1 MiB qd=8 t=1 recording swap I/O: step 1.500 s, optimizer 1.000 s"


def test_a_block_size_that_swaps_nothing_is_left_unranked_with_why(tmp_path: Path) -> None:
    got = replay_finalist(SweepPoint(block_size=8 * MiB), defaults_entry(schedule(), DEFAULT), schedule(),
                          SequentialRule(), Stage(Target(tmp_path), Journal(tmp_path / "j.jsonl")))
    assert got == ("at block_size 8388608 DeepSpeed swaps none of this job's tensors (each is under max(1 MiB, "
                   "block_size), so all stay in RAM): nothing to replay, and not an aio setting for this job's offload")


def test_a_real_sweep_ranked_on_the_replay_conforms() -> None:
    """The guide's example (tests/data/examples/README.md says how it was made): the user's job on the
    latency-bound bed, two finalists replayed, the pick confirmed on real steps."""
    doc = json.loads((Path(__file__).parents[1] / "data" / "examples" / "sweep-replay-latency-bound.json").read_text())
    assert [e.message for e in Draft202012Validator(closed_schema()).iter_errors(doc)] == []
    outcome = SweepOutcome.from_json(doc)
    assert outcome.replay is not None and outcome.replay.ranked and outcome.replay.pick == outcome.recommended
    assert outcome.step_gain is not None and outcome.step_gain.recommended
    assert json.loads(render(outcome, "json"))["replay"] == doc["replay"]
