"""The job-pattern ceiling in the trace verdict, on hand-built records: the
schedule and the measured ceiling saved with the run (older runs load
without them), the ceiling preferred and named, a share never shown above
100 %, a run faster than its job-pattern ceiling caught with
check_against_ceiling's text, the steady steps' rate (never the first
step's) compared, and `--ceiling`'s choices (what it replays, at which
settings, where, and its one re-measure). A real trace on a capped drive is
in test_job_ceiling_bed.py."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from iotune.analysis.verdict import judge
from iotune.cli import cli
from iotune.cli import job_ceiling as cli_job
from iotune.errors import IotuneError
from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS, AioSettings
from iotune.model.attribution import EXP_AVG, SwapTotal
from iotune.model.job_ceiling import MeasuredJobCeiling
from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule, swap_schedule
from iotune.model.replay_result import JobCeiling, SettingRuns, check_against_ceiling
from iotune.model.run import TraceRun
from iotune.model.runfile import RUN_FILE, TIMELINE_FILE, load_run, save_record, save_run
from iotune.model.verdict import DeviceCeiling, Verdict, VerdictInputs
from iotune.render.registry import render
from iotune.resources import schema_path

from tests.verdict_records import training_run

MB = 1_000_000
MiB = 1 << 20
STEADY = 2 * MiB / 0.01          # training_run: 1 MiB each way per busy 10 ms interval, 209.7 MB/s
OWN_AIO = AioSettings(block_size=512 * 1024)
SCHEDULE = SwapSchedule((SwapGroup((SwapOp("read", "zero_stage_3/optimizer/rank0/a.swp", 40 * MB),), wait_s=1.0),
                         SwapGroup((SwapOp("write", "zero_stage_3/optimizer/rank0/a.swp", 40 * MB),), wait_s=1.0)),
                        step=2, optimizer_s=2.0, traced_s=2.0, swap_dir="/mnt/nvme/swap", traced_aio=OWN_AIO)


def job(median_mb: float, low_mb: float, high_mb: float) -> JobCeiling:
    runs = (SettingRuns(DEEPSPEED_AIO_DEFAULTS, (low_mb * MB, median_mb * MB, high_mb * MB)),)
    return JobCeiling(DEEPSPEED_AIO_DEFAULTS, median_mb * MB, low_mb * MB, high_mb * MB, 3, runs, 80 * MB, 2)


def measured(c: JobCeiling, earlier: tuple[JobCeiling, ...] = ()) -> MeasuredJobCeiling:
    return MeasuredJobCeiling("loop0", "/mnt/nvme/swap", c, "2026-11-28T22:00:00+00:00", earlier)


def job_input(c: JobCeiling, *others: DeviceCeiling) -> VerdictInputs:
    return VerdictInputs(ceilings=(*others, DeviceCeiling.of_job(measured(c))))


def findings(v: Verdict, kind: str) -> list[Any]:
    return list(v.of_kind(kind))


def distance(v: Verdict) -> tuple[str, dict[str, Any]]:
    [f] = findings(v, "distance")
    return f.headline, f.figures


# --- saved with the run ------------------------------------------------------------------


def with_both() -> TraceRun:
    return replace(training_run(), swap_schedule=SCHEDULE, job_ceiling=measured(job(220, 218, 222), (job(150, 148, 152),)))


def test_the_schedule_and_the_ceiling_are_saved_with_the_run_and_older_runs_load(tmp_path: Path) -> None:
    run = with_both()
    back = load_run(save_run(run, tmp_path / "run"))
    assert back.swap_schedule == SCHEDULE and back.job_ceiling == run.job_ceiling
    assert back.job_ceiling is not None and back.job_ceiling.attempts == 2
    assert back.swap_schedule is not None and back.swap_schedule.traced_aio == OWN_AIO
    older = run.to_json(include_timeline=False)
    del older["swap_schedule"], older["job_ceiling"]
    old = TraceRun.from_json(older)
    assert old.swap_schedule is None and old.job_ceiling is None
    doc = run.to_json()
    del doc["swap_schedule"]["traced_aio"], doc["swap_schedule"]["swap_dir"]       # a schedule from before both
    assert TraceRun.from_json(doc).swap_schedule == replace(SCHEDULE, swap_dir="", traced_aio=None)


def _closed(node: Any) -> Any:
    """The schema with every object that lists properties closed to other keys, and requiring them all."""
    if isinstance(node, list):
        return [_closed(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if "properties" in node:
        out.setdefault("additionalProperties", False)
        out["required"] = sorted(set(node["properties"]) - {"timeline", "verdict"})
    return out


def schema_problems(name: str, doc: Any) -> list[str]:
    s = json.loads(schema_path(name).read_text())
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for variant in (s, _closed(copy.deepcopy(s))) for e in Draft202012Validator(variant).iter_errors(doc)]


def test_the_saved_keys_are_described_in_the_schemas(tmp_path: Path) -> None:
    """Every key of the schedule and of the ceiling is described (and only those), in run.json and in
    the report's JSON; a run without them writes null."""
    run = with_both()
    saved = json.loads((save_run(run, tmp_path / "run") / RUN_FILE).read_text())
    assert schema_problems("run-1", saved) == []
    doc = json.loads(render(run, "json"))
    assert schema_problems("trace-report-1", doc) == []
    bare = json.loads(render(training_run(), "json"))
    assert bare["run"]["swap_schedule"] is None and bare["run"]["job_ceiling"] is None
    assert schema_problems("trace-report-1", bare) == []


def test_a_ceiling_saved_later_rewrites_only_run_json(tmp_path: Path) -> None:
    where = save_run(training_run(), tmp_path / "run")
    timeline = (where / TIMELINE_FILE).read_bytes()
    os.chmod(where / RUN_FILE, 0o640)
    save_record(replace(load_run(where), job_ceiling=measured(job(220, 218, 222))), where)
    assert (where / TIMELINE_FILE).read_bytes() == timeline and not (where / (RUN_FILE + ".tmp")).exists()
    assert (os.stat(where / RUN_FILE).st_mode & 0o777) == 0o640
    back = load_run(where)
    assert back.job_ceiling == measured(job(220, 218, 222)) and back.timeline == training_run().timeline
    # a run.json holding its timeline inline keeps it
    inline = tmp_path / "inline.json"
    inline.write_text(json.dumps(training_run().to_json()))
    save_record(replace(training_run(), job_ceiling=measured(job(220, 218, 222))), inline)
    assert json.loads(inline.read_text())["timeline"] and load_run(inline).job_ceiling is not None


def test_the_hooks_events_give_the_schedule_its_swap_directory_and_the_jobs_aio_settings() -> None:
    ms, path = 1_000_000, "/mnt/nvme/swap/zero_stage_3/optimizer/rank0/a.swp"

    def step(s: int, t: int) -> list[dict[str, Any]]:
        return [{"k": "phase", "n": "forward", "s": s, "t0": t * ms, "t1": (t + 10) * ms},
                {"k": "swap", "d": "r", "p": path, "b": MiB, "s": s, "n": "optimizer", "t": (t + 11) * ms},
                {"k": "wait", "s": s, "n": "optimizer", "t0": (t + 12) * ms, "t1": (t + 20) * ms},
                {"k": "swap", "d": "w", "p": path, "b": MiB, "s": s, "n": "optimizer", "t": (t + 21) * ms},
                {"k": "wait", "s": s, "n": "optimizer", "t0": (t + 22) * ms, "t1": (t + 30) * ms},
                {"k": "phase", "n": "optimizer", "s": s, "t0": (t + 10) * ms, "t1": (t + 31) * ms}]

    aio = {"k": "aio", "block_size": 524288, "queue_depth": 8, "single_submit": False, "overlap_events": True,
           "intra_op_parallelism": 1, "t": 1}
    events = [{"k": "proc", "pid": 7, "rank": 0}, aio, *step(0, 100), *step(1, 200), *step(2, 300)]
    s = swap_schedule(events)
    assert s.swap_dir == "/mnt/nvme/swap" and s.traced_aio == OWN_AIO
    assert s.ops[0].path == "zero_stage_3/optimizer/rank0/a.swp"
    assert swap_schedule([e for e in events if e is not aio]).traced_aio is None       # an older hook's events


# --- the verdict ------------------------------------------------------------------------------


def test_a_job_pattern_ceiling_is_preferred_and_named() -> None:
    fio = DeviceCeiling("loop0", 1e9, "fio probe (--ceiling) in /mnt/nvme: 1 MiB requests at queue depth 32")
    v = judge(training_run(), job_input(job(220, 218, 222), fio))
    head, d = distance(v)
    assert d["ceiling_kind"] == "job-pattern" and d["ceiling_bytes_per_s"] == 220 * MB
    assert (d["ceiling_min_bytes_per_s"], d["ceiling_max_bytes_per_s"], d["ceiling_runs"]) == (218 * MB, 222 * MB, 3)
    assert d["share_of_ceiling"] == pytest.approx(STEADY / 220e6)                       # 0.953
    assert head.endswith("209.7 MB/s in the median steady step (steps 1–2): 95% of its ceiling, this job's swap pattern "
                         "replayed, 220.0 MB/s (218.0–222.0, 3 runs).")
    assert str(d["ceiling_source"]).startswith("this job's swap pattern replayed on loop0 in /mnt/nvme/swap: 220.0 MB/s")
    assert not findings(v, "note")
    # what faster drives would buy reads the job-pattern ceiling
    [what_if] = [f.figures for f in findings(v, "advice") if "RAID0" in f.headline]
    assert what_if["drive_bytes_per_s"] == 220 * MB
    assert what_if["drive_bandwidth_source"] == "its ceiling, this job's swap pattern replayed"
    [flight] = [f for f in findings(v, "advice") if "in flight" in f.headline]
    assert "the drive runs at 95% of its ceiling while busy" in flight.headline
    # without one, the other pattern's ceiling, named as such
    head, d = distance(judge(training_run(), VerdictInputs(ceilings=(fio,))))
    assert d["ceiling_kind"] == "other-pattern" and d["ceiling_runs"] is None
    assert head.endswith("21% of its 1,000.0 MB/s ceiling (fio probe (--ceiling) in /mnt/nvme: 1 MiB requests at "
                         "queue depth 32; not this job's pattern).")


def test_a_run_faster_than_its_job_ceiling_is_shown_at_100_percent_with_the_re_measure_note() -> None:
    c = job(150, 148, 152)
    v = judge(training_run(), job_input(c))
    head, d = distance(v)
    assert d["share_of_ceiling"] == 1.0 and d["compared_bytes_per_s"] == pytest.approx(STEADY)
    assert head.endswith(": at its ceiling, this job's swap pattern replayed, 150.0 MB/s (148.0–152.0, 3 runs), and "
                         "above that ceiling's top: re-measure (see the note).")
    [note] = findings(v, "note")
    warning = check_against_ceiling(STEADY, c)
    assert warning is not None and note.headline == f"loop0: {warning}."
    assert note.headline.startswith("loop0: measured faster than the ceiling: re-measure. The run moved 209.7 MB/s")
    assert note.figures["ceiling_max_bytes_per_s"] == 152 * MB
    [flight] = [f for f in findings(v, "advice") if "in flight" in f.headline]
    assert "at 100% of its ceiling" in flight.headline
    # at the top of the spread is not above it
    assert not findings(judge(training_run(), job_input(job(200, 190, STEADY * (1 + 1e-9) / MB))), "note")


def test_a_run_faster_than_a_ceiling_of_another_pattern_says_that_ceiling_does_not_bound_it() -> None:
    fio = DeviceCeiling("loop0", 150e6, "fio probe (--ceiling) in /mnt/nvme: 1 MiB requests at queue depth 32")
    v = judge(training_run(), VerdictInputs(ceilings=(fio,)))
    head, d = distance(v)
    assert d["share_of_ceiling"] == 1.0 and not findings(v, "note")
    assert "faster than its 150.0 MB/s ceiling (fio probe (--ceiling) in /mnt/nvme: 1 MiB requests at queue depth 32; " \
           "not this job's pattern), so that ceiling does not bound this job — a run traced by this iotune keeps a " \
           "steady step's swap I/O for `iotune report RUN --ceiling` to replay." in head
    head, _ = distance(judge(replace(training_run(), swap_schedule=SCHEDULE), VerdictInputs(ceilings=(fio,))))
    assert head.endswith("— `iotune report RUN --ceiling` measures the job's own (its swap I/O replayed).")
    assert "%" not in head.split("steady step", 1)[1]           # no share shown above 100 %, nor capped to it


def busier_first_step(steps: int) -> TraceRun:
    """training_run with step 0 moving twice the bytes in the same intervals (Adam's moments created)."""
    run = training_run(steps=steps)
    return replace(run, timeline=tuple(p._replace(bytes=2 * p.bytes) if p.t_s < 0.5 else p for p in run.timeline))


@pytest.mark.parametrize("steps, compared", [(4, "steps 1–2"), (3, "steps 1–2")])
def test_the_rate_compared_with_the_ceiling_is_the_steady_steps_never_the_first(steps: int, compared: str) -> None:
    # with 3 steps every step is "steady" for the stall; the rate still leaves step 0 out
    head, d = distance(judge(busier_first_step(steps), job_input(job(220, 218, 222))))
    whole = (steps + 1) * 60 * MiB / (steps * 0.3)            # step 0 counts twice: what a mean over the run shows
    assert d["bytes_per_s_busy"] == pytest.approx(whole) and d["bytes_per_s_busy"] > 220 * MB
    assert d["steady_bytes_per_s_busy"] == pytest.approx(STEADY) and d["steady_steps"] == 2
    assert d["compared_bytes_per_s"] == pytest.approx(STEADY) and d["share_of_ceiling"] == pytest.approx(STEADY / 220e6)
    assert f"209.7 MB/s in the median steady step ({compared}): 95% of its ceiling" in head


def test_a_step_the_drive_caught_up_in_a_burst_does_not_carry_the_figure() -> None:
    # steps 1-4 are compared; in step 3 the job stalled and a throttle let the backlog through at twice the rate
    run = training_run(steps=6)
    t3 = (3 * 500 + 100) / 1000
    burst = replace(run, timeline=tuple(p._replace(bytes=2 * p.bytes) if t3 <= p.t_s < t3 + 0.3 else p
                                        for p in run.timeline))
    _, d = distance(judge(burst, job_input(job(220, 218, 222))))
    assert d["steady_steps"] == 4 and d["compared_bytes_per_s"] == pytest.approx(STEADY)      # the median step's
    assert not findings(judge(burst, job_input(job(220, 218, 222))), "note")


def test_a_cap_is_named_as_a_limit_set_on_the_drive() -> None:
    cap = DeviceCeiling("loop0", 200e6, "the scratch drive's blkio cap (--drive-cap), each direction", 200e6, 200e6,
                        cap=True)
    head, d = distance(judge(training_run(), VerdictInputs(ceilings=(cap,))))
    assert d["ceiling_kind"] == "cap" and "not this job's pattern" not in head
    assert "faster than its 200.0 MB/s ceiling (the scratch drive's blkio cap (--drive-cap), each direction), so" in head


def test_a_run_of_one_step_compares_the_whole_run() -> None:
    head, d = distance(judge(training_run(steps=1), job_input(job(220, 218, 222))))
    assert d["steady_steps"] is None and d["compared_bytes_per_s"] == pytest.approx(STEADY)
    assert "steady step" not in head and "95% of its ceiling" in head


def test_a_save_is_not_compared_with_the_swap_patterns_ceiling() -> None:
    from tests.records import checkpointed_run

    run = checkpointed_run()
    dev = next(d.name for d in run.devices if not d.is_lower)
    c = DeviceCeiling.of_job(replace(measured(job(220, 218, 222)), device=dev))
    notes = [f.headline for f in judge(run, VerdictInputs(ceilings=(c,))).of_kind("note") if "save_checkpoint" in f.headline]
    assert notes and all("ceiling" not in n for n in notes)
    fio = DeviceCeiling(dev, 1e6, "fio", 1e6, 1e6)
    notes = [f.headline for f in judge(run, VerdictInputs(ceilings=(c, fio))).of_kind("note") if "save_checkpoint" in f.headline]
    assert all(f"faster than {dev}'s write ceiling (1.0 MB/s, measured with another pattern)" in n for n in notes)


# --- report RUN: the saved ceiling shown again --------------------------------------------


def test_report_shows_the_saved_job_ceiling_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)        # no ./iotune-sweeps
    where = save_run(replace(training_run(), job_ceiling=measured(job(220, 218, 222))), tmp_path / "run")
    r = CliRunner().invoke(cli, ["report", str(where), "--json"])
    assert r.exit_code == 0, r.stderr
    v = Verdict.from_json(json.loads(r.stdout)["verdict"])
    _, d = distance(v)
    assert d["ceiling_kind"] == "job-pattern" and d["ceiling_bytes_per_s"] == 220 * MB
    assert ("ceiling of loop0: this job's swap pattern replayed, 220.0 MB/s (218.0–222.0, 3 runs), saved with the "
            "run (2026-11-28T22:00:00+00:00)") in r.stderr
    r = CliRunner().invoke(cli, ["report", str(where)])
    assert "95% of its ceiling, this job's swap pattern replayed, 220.0 MB/s (218.0–222.0, 3 runs)." in " ".join(
        r.stdout.split())


# --- --ceiling: what it replays, at which settings, where, and its one re-measure ------------


def test_the_ceiling_replays_at_deepspeeds_defaults_and_the_jobs_own_settings() -> None:
    assert cli_job.ceiling_settings(SCHEDULE) == [DEEPSPEED_AIO_DEFAULTS, OWN_AIO]
    assert cli_job.ceiling_settings(replace(SCHEDULE, traced_aio=DEEPSPEED_AIO_DEFAULTS)) == [DEEPSPEED_AIO_DEFAULTS]
    assert cli_job.ceiling_settings(replace(SCHEDULE, traced_aio=None)) == [DEEPSPEED_AIO_DEFAULTS]
    assert cli_job.ceiling_settings(replace(SCHEDULE, traced_aio=AioSettings(use_gds=True))) == [DEEPSPEED_AIO_DEFAULTS]


def test_runs_the_replay_cannot_serve_say_why() -> None:
    assert cli_job.why_no_replay(training_run()) is not None
    assert "no swap schedule" in str(cli_job.why_no_replay(training_run()))
    run = replace(training_run(), swap_schedule=SCHEDULE)
    assert cli_job.why_no_replay(run) is None
    att = run.attribution
    assert att is not None
    two = replace(run, attribution=replace(att, swaps=(*att.swaps, SwapTotal(1, 1, "optimizer", EXP_AVG, "read", MB, 1))))
    assert cli_job.why_no_replay(two) == ("2 ranks swapped to the drive at once, and the replay repeats rank 0's swap "
                                          "I/O alone, a fraction of the drive's load")
    with pytest.raises(IotuneError, match="does not say where its swap files were"):
        cli_job.replay_place(replace(SCHEDULE, swap_dir=""), [])


def test_the_swap_directory_must_be_on_a_traced_device_that_is_here(tmp_path: Path) -> None:
    gone = replace(SCHEDULE, swap_dir=str(tmp_path / "gone" / "swap"))
    with pytest.raises(IotuneError) as e:       # tmp_path holds it now, and no traced device is here
        cli_job.replay_place(gone, [])
    assert str(tmp_path) in str(e.value)


def test_a_run_faster_than_the_first_measure_is_measured_once_more(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    measures = [job(150, 148, 152), job(220, 218, 222)]
    asked: list[list[AioSettings]] = []

    def fake_measure(schedule: SwapSchedule, directory: Path, settings: list[AioSettings]) -> JobCeiling:
        asked.append(settings)
        return measures[len(asked) - 1]

    monkeypatch.setattr(cli_job, "replay_place", lambda schedule, present: ("loop0", tmp_path))
    monkeypatch.setattr(cli_job, "_measure", fake_measure)
    said: list[str] = []
    run = replace(training_run(), swap_schedule=SCHEDULE)
    got = cli_job.measure_job_ceiling(run, [], said.append)
    assert got is not None and got.ceiling == measures[1] and got.earlier == (measures[0],) and got.device == "loop0"
    assert asked == [[DEEPSPEED_AIO_DEFAULTS, OWN_AIO]] * 2
    assert said[0].startswith("ceiling: replaying step 2's swap I/O (80.00 MB) without compute on loop0 in ")
    assert said[1] == ("ceiling: the run's median steady step moved 209.7 MB/s while busy, above the top of this job's swap "
                       "pattern replayed, 150.0 MB/s (148.0–152.0, 3 runs): measuring it once more")
    assert "measured again (2 measurements)" in DeviceCeiling.of_job(got).source
    # within the first measure's spread: measured once
    measures[:] = [job(220, 218, 222)]
    asked.clear()
    got = cli_job.measure_job_ceiling(run, [], said.append)
    assert got is not None and got.earlier == () and len(asked) == 1
    # a run that stays faster after the re-measure: the verdict carries the warning
    measures[:] = [job(150, 148, 152), job(151, 149, 153)]
    asked.clear()
    got = cli_job.measure_job_ceiling(run, [], said.append)
    assert got is not None and got.attempts == 2
    v = judge(run, VerdictInputs(ceilings=(DeviceCeiling.of_job(got),)))
    assert [f.headline.split(":")[1] for f in v.of_kind("note")] == [" measured faster than the ceiling"]


def test_no_schedule_means_the_fio_probe_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    assert cli_job.measure_job_ceiling(training_run(), [], said.append) is None
    assert said == ["ceiling: the run holds no swap schedule of a steady NVMe optimizer step (traced by an older "
                    "iotune or with --no-inject, no optimizer state on NVMe, a single step, or parameters swapped to "
                    "NVMe): the fio probe measures instead (fio's pattern, not this job's)"]
    monkeypatch.setattr(cli_job, "replay_place", lambda schedule, present: ("loop0", Path("/nonexistent")))

    def broken(schedule: SwapSchedule, directory: Path, settings: list[AioSettings]) -> JobCeiling:
        raise IotuneError("the replay was killed by SIGABRT")

    monkeypatch.setattr(cli_job, "_measure", broken)
    said.clear()
    assert cli_job.measure_job_ceiling(replace(training_run(), swap_schedule=SCHEDULE), [], said.append) is None
    assert said[-1] == ("warning: the job-pattern ceiling could not be measured: the replay was killed by SIGABRT; the "
                        "fio probe measures instead (fio's pattern, not this job's)")
