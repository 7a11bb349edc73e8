"""The spine every kind of sweep shares (iotune/sweep/): one journal (the
checkpoint sweep's trials a record kind of it, with its identity check,
--fresh and resume), one verdict on whether a peak fits the host (lint,
doctor and the offload search agree at every boundary), one trial time
limit, and one way to name the default output directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from iotune.analysis.lint.memory import memory_rules
from iotune.doctor import job as doctor_job
from iotune.doctor import jobfacts
from iotune.model.checkpoint_sweep import CheckpointRequest
from iotune.model.host_memory import FIT_MARGIN, TIGHT_SHARE, HostContext, HostFit, host_fit, host_memory
from iotune.model.lint import LintEnv
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.sweep import TRIAL_TIMEOUT_S
from iotune.sweep.offload.runner import TrialPlan
from iotune.sweep.offload.space import Budget, host_fit_of, refusals
from iotune.sweep.space import RunSettings
from iotune.sweep.target import SWEEPS_DIR, default_out
from iotune.sweep.user_job import UserJob

# -- one verdict on the host's memory ----------------------------------------------------------------------------------


def test_the_verdict_at_its_boundaries() -> None:
    assert FIT_MARGIN == 0.0 and TIGHT_SHARE == 0.9
    assert host_fit(101, 100).verdict == "over"
    assert host_fit(100, 100).verdict == "tight"                # the budget itself is admitted
    assert host_fit(91, 100).verdict == "tight"
    assert host_fit(90, 100).verdict == "fits"                  # exactly 90 %: not above it
    assert host_fit(9 << 30, 10 << 30).verdict == "fits"        # 9/10 exactly, at any magnitude
    assert host_fit(100, 110, margin=0.1).verdict == "tight"    # 100 x 1.1 == 110: admitted, no float rounding
    assert host_fit(101, 110, margin=0.1).verdict == "over"
    assert not host_fit(1, 0).admitted and host_fit(0, 0).verdict == "fits"


def test_the_verdict_says_it_with_the_numbers_and_round_trips() -> None:
    over = host_fit(3 << 20, 2 << 20, budget_label=" (MemAvailable)")
    assert over.clause == "over 2.0 MiB (MemAvailable)" and not over.admitted
    assert over.sentence == "peaks at 3.0 MiB, over 2.0 MiB (MemAvailable)"
    assert host_fit(95 << 20, 100 << 20, budget_label=" of RAM").clause == (
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


def test_lint_doctor_and_the_offload_search_give_the_same_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    peak = host_memory(OffloadKnobs.from_ds_config(CFG), JobShape(NUMELS, 1), HostContext()).peak_bytes
    eps = 1e-6
    at_tight = -(-peak * 10 // 9)               # the smallest budget of which the peak is at most 90 %
    cases = {peak - 1: "over", peak: "tight", round(peak / (1 - eps)): "tight", at_tight - 1: "tight",
             at_tight: "fits", 2 * peak: "fits"}
    for budget, expected in cases.items():
        got = (lint_verdict(budget), doctor_verdict(budget, monkeypatch), offload_verdict(budget))
        assert got == (expected,) * 3, (budget, peak, got)


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
