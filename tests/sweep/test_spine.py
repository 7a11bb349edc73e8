"""The spine every kind of sweep shares (iotune/sweep/): one journal (the
checkpoint sweep's trials a record kind of it, with its identity check,
--fresh and resume), one verdict on whether a peak fits the host (lint,
doctor and the offload search agree at every boundary), one trial time
limit, and one way to name the default output directory."""

from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from iotune.analysis.lint.memory import memory_rules
from iotune.doctor import job as doctor_job
from iotune.doctor import jobfacts
from iotune.errors import UsageError
from iotune.model.checkpoint import WriterSettings
from iotune.model.checkpoint_sweep import CheckpointCandidate, CheckpointRequest, CheckpointTrial, RestoreCheck
from iotune.model.host_memory import (FIT_MARGIN, MARGIN_HEADROOM, TIGHT_SHARE, UNDER_PREDICTION, HostContext, HostFit,
                                     host_fit, host_memory, margin_note)
from iotune.model.journal import read_journal
from iotune.model.lint import LintEnv
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.sweep import TRIAL_TIMEOUT_S
from iotune.sweep.checkpoint.sweep import LEGACY_JOURNAL, run_checkpoint_sweep
from iotune.sweep.journal import NAME, open_journal
from iotune.sweep.offload.runner import TrialPlan
from iotune.sweep.offload.space import Budget, host_fit_of, refusals
from iotune.sweep.space import RunSettings
from iotune.sweep.target import SWEEPS_DIR, default_out
from iotune.sweep.user_job import UserJob

# -- one verdict on the host's memory ----------------------------------------------------------------------------------


def test_the_verdict_at_its_boundaries() -> None:
    assert FIT_MARGIN == round(UNDER_PREDICTION + MARGIN_HEADROOM, 4) and MARGIN_HEADROOM == 0.02
    assert TIGHT_SHARE == 0.9
    assert host_fit(101, 100, margin=0.0).verdict == "over"
    assert host_fit(100, 100, margin=0.0).verdict == "tight"    # without a margin the budget itself is admitted
    assert host_fit(91, 100, margin=0.0).verdict == "tight"
    assert host_fit(90, 100, margin=0.0).verdict == "fits"      # exactly 90 %: not above it
    assert host_fit(9 << 30, 10 << 30, margin=0.0).verdict == "fits"     # 9/10 exactly, at any magnitude
    assert host_fit(100, 110, margin=0.1).verdict == "tight"    # 100 x 1.1 == 110: admitted, no float rounding
    assert host_fit(101, 110, margin=0.1).verdict == "over"
    assert not host_fit(1, 0).admitted and host_fit(0, 0).verdict == "fits"


def test_the_verdict_says_it_with_the_numbers_and_round_trips() -> None:
    over = host_fit(3 << 20, 2 << 20, margin=0.0, budget_label=" (MemAvailable)")
    assert over.clause == "over 2.0 MiB (MemAvailable)" and not over.admitted
    assert over.sentence == "peaks at 3.0 MiB, over 2.0 MiB (MemAvailable)"
    assert host_fit(95 << 20, 100 << 20, margin=0.0, budget_label=" of RAM").clause == (
        "95 % of 100.0 MiB of RAM: above 90 %, little is left for the page cache and other processes")
    assert host_fit(50 << 20, 100 << 20).clause == "50.0 MiB to spare of 100.0 MiB"
    assert host_fit(100, 105, margin=0.1).clause.endswith("with a 10 % margin")
    fit = host_fit(95, 100)
    assert HostFit.from_json(json.loads(json.dumps(fit.to_json()))) == fit
    assert HostFit.from_json({"verdict": "fits", "peak_bytes": 1, "budget_bytes": 2}).margin == FIT_MARGIN   # older


CFG = {"zero_optimization": {"stage": 3, "sub_group_size": 10_000_000,
                             "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
NUMELS = (10_000_000, 4_000_000)


def lint_verdict(budget: int) -> str:
    found = [f for f in memory_rules(CFG, LintEnv(ram_bytes=budget, numels=NUMELS)) if f.rule == "host-memory"]
    return {(): "fits", ("warning",): "tight", ("error",): "over"}[tuple(f.severity for f in found)]


def doctor_verdict(budget: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(doctor_job, "ram_bytes", lambda *_: budget)            # MemAvailable
    monkeypatch.setattr(jobfacts, "cgroup_memory_limit", lambda: None)
    checks = doctor_job.check_memory(doctor_job.Job(CFG, numels=NUMELS), LintEnv(ram_bytes=budget, numels=NUMELS))
    [host] = [c for c in checks if c.name == "host memory"]
    return {"ok": "fits", "warn": "tight", "fail": "over"}[host.status]


def offload_verdict(budget: int) -> str:
    knobs, shape = OffloadKnobs.from_ds_config(CFG), JobShape(NUMELS, 1)
    refused = refusals(knobs, shape, Budget(budget, None, "MemAvailable"), HostContext())
    fit = host_fit_of(host_memory(knobs, shape, HostContext()), Budget(budget))
    assert fit is not None and bool(refused) == (fit.verdict == "over"), refused
    return fit.verdict


def test_the_margin_refuses_just_over_and_admits_just_under() -> None:
    """Admitted only when peak x (1 + FIT_MARGIN) fits: a budget one byte
    under that product refuses, the product itself admits (exactly, at any
    magnitude); the clause names the margin and where it comes from."""
    for peak in (1_000_000, 13_900_000_000):
        need = math.ceil(Fraction(peak) * (1 + Fraction(repr(FIT_MARGIN))))
        assert host_fit(peak, need).admitted and not host_fit(peak, need - 1).admitted
        assert host_fit(peak, need - 1).clause.endswith(f"with a {FIT_MARGIN * 100:.3g} % margin")
    assert margin_note() == (f"a {FIT_MARGIN * 100:.1f} % margin: the worst under-prediction measured, "
                             f"{UNDER_PREDICTION * 100:.1f} %, plus 2 %")


def test_lint_doctor_and_the_offload_search_give_the_same_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    peak = host_memory(OffloadKnobs.from_ds_config(CFG), JobShape(NUMELS, 1), HostContext()).peak_bytes
    eps = 1e-6
    need = math.ceil(Fraction(peak) * (1 + Fraction(repr(FIT_MARGIN))))     # the least budget the margin admits
    at_tight = -(-peak * 10 // 9)               # the smallest budget of which the peak is at most 90 %

    def expected(budget: int) -> str:
        if budget < need:
            return "over"
        return "fits" if budget >= at_tight else "tight"     # tight only where the margin is under 1/9
    budgets = [need - 1, need, round(need / (1 - eps)), at_tight - 1, at_tight, 2 * peak]
    assert expected(need - 1) == "over" and expected(need) != "over" and expected(2 * peak) == "fits"
    for budget in budgets:
        got = (lint_verdict(budget), doctor_verdict(budget, monkeypatch), offload_verdict(budget))
        assert got == (expected(budget),) * 3, (budget, peak, got)


# -- one trial time limit ----------------------------------------------------------------------------------------------


def test_one_trial_time_limit() -> None:
    assert TRIAL_TIMEOUT_S == 1800.0
    assert RunSettings().steps_timeout_s == TrialPlan().timeout_s == TRIAL_TIMEOUT_S
    assert CheckpointRequest(swap_dir="/s", out_dir="/o").timeout_s == TRIAL_TIMEOUT_S
    assert UserJob(argv=("x",), config_path=Path("c.json")).timeout_s == TRIAL_TIMEOUT_S


# -- one default output directory --------------------------------------------------------------------------------------


def test_every_default_output_directory_is_named_by_one_function() -> None:
    drive = {"fs": "uuid-1"}
    digest = hashlib.sha1(json.dumps(drive, sort_keys=True).encode()).hexdigest()[:8]
    # the aio sweep's and the offload search's names are what they were: their journals resume
    assert default_out("default", drive, "fio") == Path("iotune-sweeps") / f"default-fio-{digest}"
    job = {"model": "tiny", "seq_len": 128, "steps": 4}
    with_job = hashlib.sha1(json.dumps([drive, job], sort_keys=True).encode()).hexdigest()[:8]
    assert default_out("offload", drive, job=job) == SWEEPS_DIR / f"offload-{with_job}"
    assert default_out("checkpoint", drive, job=job) == SWEEPS_DIR / f"checkpoint-{with_job}"
    assert default_out("quick", None, "fio", "layouts") == SWEEPS_DIR / "quick-fio-layouts"     # iotune's own drives
    assert default_out("quick", drive, "fio", "netfs") == SWEEPS_DIR / f"quick-fio-netfs-{digest}"


# -- one journal -------------------------------------------------------------------------------------------------------

PYTHON = CheckpointCandidate(WriterSettings("python"))


def trial(c: CheckpointCandidate, save_s: float = 1.0) -> CheckpointTrial:
    check = RestoreCheck(True, (6.0,), (6.0,), 0.0, True, 0.5)
    return CheckpointTrial(c, 0, "ok", "", save_s, 100, {}, {}, 10, (1.0, 1.0), (1.5, 1.0), check)


def request(tmp_path: Path, **kw: object) -> CheckpointRequest:
    (tmp_path / "swap").mkdir(exist_ok=True)
    return CheckpointRequest(swap_dir=str(tmp_path / "swap"), out_dir=str(tmp_path / "out"),
                             writers=(WriterSettings("python"),), **kw)  # type: ignore[arg-type]


def test_checkpoint_trials_are_a_record_kind_of_the_one_journal(tmp_path: Path) -> None:
    q = request(tmp_path)
    run_checkpoint_sweep(q, runner=lambda req, c, r: trial(c), drive={"fs": "uuid-1"})
    contents = read_journal(tmp_path / "out" / NAME)
    assert contents.env is not None and contents.env.mode == "checkpoint" and contents.env.drive == {"fs": "uuid-1"}
    assert "swap_dir" not in contents.env.request and contents.env.request["writers"][0]["kind"] == "python"
    assert [t.candidate for t in contents.checkpoint_trials] == [CheckpointCandidate(), PYTHON]
    assert contents.trials == () and contents.offload_trials == ()
    # the same request on the same drive resumes, whatever directory it swaps to this time
    (tmp_path / "other-swap").mkdir()
    moved = CheckpointRequest(**{**vars(q), "swap_dir": str(tmp_path / "other-swap")})
    run_checkpoint_sweep(moved, runner=lambda *a: pytest.fail("ran a trial the journal holds"), drive={"fs": "uuid-1"})


def test_another_drive_or_fresh_keeps_the_checkpoint_journal_aside(tmp_path: Path) -> None:
    said: list[str] = []
    q = request(tmp_path)
    run_checkpoint_sweep(q, said.append, lambda req, c, r: trial(c), drive={"fs": "uuid-1"})
    said.clear()
    run_checkpoint_sweep(q, said.append, lambda req, c, r: trial(c), drive={"fs": "uuid-2"})
    [kept] = sorted((tmp_path / "out").glob("journal.*.jsonl"))
    assert said[0] == (f"sweep: the journal in {tmp_path / 'out'} was recorded with drive {{'fs': 'uuid-1'}}, not "
                       f"{{'fs': 'uuid-2'}}: starting a new one (the old one is kept as {kept.name})")
    said.clear()
    run_checkpoint_sweep(q, said.append, lambda req, c, r: trial(c), fresh=True, drive={"fs": "uuid-2"})
    assert len(list((tmp_path / "out").glob("journal.*.jsonl"))) == 2
    assert said[0].startswith(f"sweep: --fresh: starting a new journal in {tmp_path / 'out'} (the old one is kept as ")


def test_an_older_checkpoint_journal_is_refused_naming_fresh_and_kept_with_it(tmp_path: Path) -> None:
    q = request(tmp_path)
    (tmp_path / "out").mkdir()
    legacy = tmp_path / "out" / LEGACY_JOURNAL
    legacy.write_text(json.dumps({"kind": "header", "version": 1, "request": q.identity()}) + "\n")
    with pytest.raises(UsageError) as e:
        run_checkpoint_sweep(q, runner=lambda *a: pytest.fail("ran a trial"))
    assert str(e.value) == (f"{legacy} is the journal of an older iotune's checkpoint sweep, which this one does not "
                            f"resume (its trials now go into {tmp_path / 'out' / NAME}, with the drive's identity): "
                            f"run again with --fresh to start a new journal (the old one is kept beside it, "
                            f"renamed), or give another -o/--out")
    said: list[str] = []
    run_checkpoint_sweep(q, said.append, lambda req, c, r: trial(c), fresh=True)
    [kept] = (tmp_path / "out").glob("checkpoint-journal.*.jsonl")
    assert not legacy.exists() and kept.read_text().startswith('{"kind": "header"')
    assert said[0] == f"checkpoint sweep: --fresh: the older journal {LEGACY_JOURNAL} is kept as {kept.name}"
    assert len(read_journal(tmp_path / "out" / NAME).checkpoint_trials) == 2


def test_every_kind_of_trial_lives_in_one_journal_file(tmp_path: Path) -> None:
    j = open_journal(tmp_path, False)
    j.record_checkpoint(trial(PYTHON))
    with (tmp_path / NAME).open("a") as fh:
        fh.write('{"kind": "checkpoint-trial", "candidate": {')                      # a kill mid-write
    again = open_journal(tmp_path, False)
    assert again.find_checkpoint(PYTHON, 0) == trial(PYTHON) and again.find_checkpoint(PYTHON, 1) is None
    with (tmp_path / NAME).open("a") as fh:
        fh.write('\n{"kind": "checkpoint-trial", "candidate": 5}\n')
    with pytest.raises(Exception, match=r":3: not a checkpoint trial record \(AttributeError"):
        open_journal(tmp_path, False)


def test_the_checkpoint_command_resumes_on_the_same_drive_whatever_scratch_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run swaps to a new scratch directory under --path: the journal is
    keyed by the drive, so the second run resumes, in the default directory
    default_out names."""
    from iotune.sweep.checkpoint import command
    from iotune.sweep.target import drive_of

    ran: list[str] = []

    def sweep(req: CheckpointRequest, say: object, **kw: object) -> object:
        ran.append(req.swap_dir)
        return run_checkpoint_sweep(req, runner=lambda q, c, r: trial(c), **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "run_checkpoint_sweep", sweep)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drive").mkdir()
    args = command.CheckpointArgs(target_dir=tmp_path / "drive")
    first = command.run_checkpoint_command(args, lambda s: None)
    again = command.run_checkpoint_command(args, lambda s: None)
    job = {"cmd": None, "config": "", "model": None}
    [journal] = (tmp_path / default_out("checkpoint", drive_of(args), job=job)).glob("*.jsonl")
    assert journal.name == NAME and ran[0] != ran[1]
    assert len(read_journal(journal).checkpoint_trials) == len(first.trials) == len(again.trials)   # nothing re-run
