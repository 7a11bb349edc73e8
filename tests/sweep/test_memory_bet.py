"""Memory you can bet on: the offload search's host-memory baseline is the
job's own process at deepspeed.initialize (the shape probe measures it);
candidates are admitted with a margin; MemAvailable is read again before
every trial and a trial that no longer fits is skipped with the numbers,
journaled as skipped, and the search goes on; once your config's trial has
measured its peak, every prediction that follows is corrected by what it
measured above its own and the margin shrinks to the one measured for
corrected predictions; every trial records VmHWM, failed ones as far as
they got."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from iotune.model import units
from iotune.model.journal import SweepEnv
from iotune.model.hook_events import JobTensors, MemorySample, StartupMemory, hook_env, read_memory, read_tensors
from iotune.model.host_memory import (BASELINE_JOB, CALIBRATED_MARGIN, FIT_MARGIN, HostContext, host_memory,
                                     margin_note)
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.offload_result import OffloadOutcome, OffloadTrial
from iotune.model.offload_time import DriveRates
from iotune.render.base import RenderOptions
from iotune.render.offload import offload_console
from iotune.resources import inject_dir
from iotune.sweep.executor import Target
from iotune.sweep.journal import open_journal
from iotune.sweep.offload import search as search_module
from iotune.sweep.offload.memory import corrected, host_baseline, job_context, memory_now
from iotune.sweep.offload.runner import BuiltinRunner, RunResult, TrialPlan, memory_seen
from iotune.sweep.offload.changes import apply_changes
from iotune.sweep.offload.probe import partitioned_in
from iotune.sweep.offload.search import OffloadSearch, Trials, search_offload
from iotune.sweep.offload.space import Budget, refusals
from iotune.workloads.strategies import WorkloadSpec, ds_config

from tests.conftest import needs_deepspeed

MiB = 1 << 20
NUMELS = (4_000_000, 1_000_000, 1_000_000)
STARTUP = StartupMemory(rss_bytes=900 * MiB, peak_rss_bytes=1200 * MiB, param_storage_bytes=24 * MiB)


# -- the baseline ------------------------------------------------------------------------------------------------------


def events(tmp_path: Path, *lines: dict[str, Any]) -> Path:
    (tmp_path / "events-1.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    return tmp_path


def test_the_shape_event_carries_the_process_at_initialize_and_older_hooks_still_load(tmp_path: Path) -> None:
    shape = {"k": "shape", "numels": list(NUMELS), "world": 1, "micro": 0, "at": "initialize", "dtype": "bf16"}
    old = read_tensors(events(tmp_path, {"k": "proc", "pid": 1, "rank": 0}, shape))
    assert old is not None and old.startup is None                      # an older hook: no memory, still a shape
    new = read_tensors(events(tmp_path, {"k": "proc", "pid": 1, "rank": 0},
                              {**shape, "rss": 900 * MiB, "hwm": 1200 * MiB, "params": 24 * MiB}))
    assert new is not None and new.startup == STARTUP and new.partition_dtype == "bf16"
    assert STARTUP.baseline_bytes == 876 * MiB


def test_the_jobs_baseline_replaces_the_machines_and_its_startup_peak_is_a_floor() -> None:
    knobs = OffloadKnobs(optimizer_device="nvme", dtype="bf16")
    machine = HostContext("cpu", 450 * MiB, engine_bytes=125 * MiB)
    job = job_context(machine, STARTUP)
    assert (job.baseline_source, job.baseline_bytes, job.engine_bytes) == (BASELINE_JOB, 876 * MiB, 125 * MiB)
    mem = host_memory(knobs, JobShape(NUMELS), job)
    labels = {i.label: i.nbytes for i in mem.items if i.phase == "resident"}
    assert labels["your process at deepspeed.initialize"] == 876 * MiB
    assert labels["deepspeed.initialize itself"] == 125 * MiB and "torch + DeepSpeed" not in labels
    assert mem.peak_bytes >= 1200 * MiB                                  # never under the start-up peak
    high = job_context(machine, StartupMemory(900 * MiB, 5000 * MiB, 24 * MiB))
    assert host_memory(knobs, JobShape(NUMELS), high).peak_bytes == 5000 * MiB      # VmHWM before initialize
    assert host_memory(knobs, JobShape(NUMELS), high).peak_phase() == "start-up"
    assert job_context(machine, None) == machine                         # not measured: the machine's, as before
    assert host_memory(knobs, JobShape(NUMELS), machine).items[0].label == "torch + DeepSpeed"
    recorded = host_baseline(job)
    assert (recorded.baseline_bytes, recorded.source, recorded.margin) == (876 * MiB, "job", FIT_MARGIN)
    assert recorded.note == "VmRSS 900.0 MiB when it called deepspeed.initialize, less 24.0 MiB of parameter storage"


# -- the re-read before every trial ------------------------------------------------------------------------------------


class Reader:
    """MemAvailable as a script: one value per read, counted."""

    def __init__(self, values: list[int]) -> None:
        self.values, self.calls = list(values), 0

    def __call__(self) -> int:
        self.calls += 1
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


@dataclass
class FakeRunner:
    """A job that steps instantly: every trial ok at the same speed, its peak what the model says."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    seq_len: int = 0
    peak_rss_bytes: int = 1000 * MiB

    @property
    def what(self) -> str:
        return "a fake job"

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, plan: TrialPlan) -> RunResult:
        self.runs.append(cfg)
        return RunResult("ok", 1.0, 0.5, 1.0, step_times_s=(1.0, 1.0), peak_rss_bytes=self.peak_rss_bytes)

    def probe(self, cfg: dict[str, Any], work: Path, cgroup: str | None,
              timeout_s: float) -> tuple[JobTensors | None, str]:
        return JobTensors(NUMELS, 1, 0, "bf16", STARTUP), ""


NVME_CFG = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 3, "sub_group_size": 1_000_000,
                                  "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
BIG, SMALL = 1 << 40, 1 << 20
ENV = SweepEnv(executor="offload", mode="offload", steps_cmd={"argv": ["fake"]})


def trials_of(tmp_path: Path, reader: Reader, runner: FakeRunner) -> Trials:
    search = OffloadSearch(NVME_CFG, runner, budget=Budget(BIG, None, "MemAvailable", reader),  # type: ignore[arg-type]
                           context=job_context(HostContext("cpu", engine_bytes=125 * MiB), STARTUP))
    return Trials(search, OffloadKnobs.from_ds_config(NVME_CFG), JobShape(NUMELS), Target(tmp_path),
                  open_journal(tmp_path / "j", False, ENV), lambda s: None)


def test_memavailable_is_read_before_every_trial_and_a_trial_that_no_longer_fits_is_skipped(tmp_path: Path) -> None:
    reader, runner = Reader([BIG, BIG, SMALL, BIG]), FakeRunner()
    trials = trials_of(tmp_path, reader, runner)
    base = OffloadKnobs.from_ds_config(NVME_CFG)
    knobs = [replace(base, sub_group_size=s) for s in (1_500_000, 2_000_000, 3_000_000, 4_000_000)]
    done = [trials.run(k, "search") for k in knobs]
    assert reader.calls == 4 and len(runner.runs) == 3                       # one read per trial; one not started
    assert [t.status for t in done] == ["ok", "ok", "skipped", "ok"]
    skipped = done[2]
    peak = host_memory(knobs[2], JobShape(NUMELS), trials.search.context).peak_bytes
    assert skipped.predicted_host_bytes == peak and skipped.available_bytes == SMALL
    need = memory_now(knobs[2], JobShape(NUMELS), Budget(), trials.search.context).needed_bytes
    assert need > peak and skipped.error == (f"skipped: needs {units.mib(need)} at its peak with the margin, "
                                             f"MemAvailable is now 1.0 MiB")
    assert [t.available_bytes for t in done] == [BIG, BIG, SMALL, BIG]
    assert all(t.baseline_source == "job" and t.baseline_bytes == STARTUP.baseline_bytes for t in done)
    # journaled as skipped (not failed, not run), and tried again on resume
    lines = [json.loads(line) for line in (tmp_path / "j" / "journal.jsonl").read_text().splitlines()[1:]]
    assert [line["status"] for line in lines] == ["ok", "ok", "skipped", "ok"]
    again = trials_of(tmp_path, Reader([BIG]), runner)
    assert again.run(knobs[2], "search").status == "ok" and len(runner.runs) == 4
    assert again.run(knobs[0], "search").status == "ok" and len(runner.runs) == 4    # a trial that ran: journaled


def test_the_search_goes_on_past_a_skipped_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "drive_rates", lambda *a: DriveRates(1e9, 1e9, 5e8, 5e8))
    reader, runner = Reader([BIG, SMALL, BIG]), FakeRunner()
    search = OffloadSearch(NVME_CFG, runner, budget=Budget(BIG, None, "MemAvailable", reader),  # type: ignore[arg-type]
                           context=HostContext("cpu", 450 * MiB, engine_bytes=125 * MiB), max_trials=3,
                           time_budget_s=3600.0)   # an instant fake trial would make the derived budget ~0 s
    said: list[str] = []
    out = search_offload(search, Target(tmp_path), open_journal(tmp_path / "j", False, ENV), said.append)
    # the reference, then at least two search trials (the two best predictions always run): the first skipped;
    # MemAvailable is read before every trial, the confirmation's pairs included, and only the skip is not run
    assert reader.calls == len(out.trials) >= 3 and len(runner.runs) == len(out.trials) - 1
    assert [t.status for t in out.trials] == ["ok", "skipped"] + ["ok"] * (len(out.trials) - 2)
    searched = [t.role for t in out.trials if not t.role.startswith("pair")]
    assert searched == ["reference"] + ["search"] * (len(searched) - 1) and len(searched) >= 3
    assert [line for line in said if ": skipped: needs " in line][0].startswith("offload: search ")
    # the reference peaked under its prediction (1000 MiB, the fake job's): nothing added, the smaller margin
    assert out.memory is not None and out.memory.source == "job" and out.memory.margin == CALIBRATED_MARGIN
    assert out.memory.correction_bytes == 0
    assert f"offload: host-memory baseline: your job's own process, {units.mib(876 * MiB)}" in said[1]
    assert said[1].endswith(f"candidates are admitted with {margin_note()}")
    text = offload_console(out, RenderOptions())
    assert f"candidates admitted with {margin_note(CALIBRATED_MARGIN)}" in text and "skipped: needs " in text
    assert json.loads(json.dumps(out.to_json()))["memory"]["baseline_bytes"] == 876 * MiB


# -- corrected by your config's own trial -------------------------------------------------------------------------------


def test_a_peak_above_its_prediction_is_added_to_every_prediction_and_one_below_to_none() -> None:
    knobs = OffloadKnobs(optimizer_device="nvme", dtype="bf16")
    job = job_context(HostContext("cpu", 450 * MiB, engine_bytes=125 * MiB), STARTUP)
    predicted = host_memory(knobs, JobShape(NUMELS), job).peak_bytes
    above = OffloadTrial("{}", {}, "ok", peak_rss_bytes=predicted + 300 * MiB, predicted_host_bytes=predicted)
    fixed = corrected(job, above)
    assert fixed is not None and fixed.correction_bytes == 300 * MiB
    assert host_memory(knobs, JobShape(NUMELS), fixed).peak_bytes == predicted + 300 * MiB
    [item] = [i for i in host_memory(knobs, JobShape(NUMELS), fixed).items if i.label.startswith("measured above")]
    assert (item.nbytes, item.phase) == (300 * MiB, "resident")
    assert item.formula == (f"your config's trial peaked at {units.mib(predicted + 300 * MiB)} (VmHWM), predicted "
                            f"{units.mib(predicted)}")
    below = corrected(job, replace(above, peak_rss_bytes=predicted - 300 * MiB))
    assert below is not None and below.correction_bytes == 0          # an over-prediction is left as it is
    assert host_memory(knobs, JobShape(NUMELS), below).peak_bytes == predicted
    assert corrected(job, replace(above, status="failed")) is None and corrected(job, replace(above, peak_rss_bytes=0)) is None


def test_the_smaller_margin_admits_a_peak_the_first_one_refuses() -> None:
    knobs = OffloadKnobs(optimizer_device="nvme", dtype="bf16")
    peak = host_memory(knobs, JobShape(NUMELS)).peak_bytes
    budget = Budget(int(peak * (1 + CALIBRATED_MARGIN)) + 1, None, "MemAvailable")
    [why] = refusals(knobs, JobShape(NUMELS), budget)
    assert why.endswith(f"over {units.mib(budget.host_bytes or 0)} (MemAvailable) with a {FIT_MARGIN * 100:.3g} % margin")
    assert refusals(knobs, JobShape(NUMELS), replace(budget, margin=CALIBRATED_MARGIN)) == ()
    assert CALIBRATED_MARGIN == 0.147 and FIT_MARGIN == 0.48


def test_the_margins_cover_every_measured_run() -> None:
    """Both margins are the worst under-prediction over every run of benchmarks/memory_model.py (the
    rows of its results files), rounded up to 0.1 %, plus 2 %: first on the prediction from the job's
    baseline, then corrected by another config of the same job in the same run (each in turn)."""
    import math

    from iotune.model.host_memory import CALIBRATED_UNDER_PREDICTION, MARGIN_HEADROOM, UNDER_PREDICTION

    files = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob("memory_model-*.json"))
    errors, corrected_errors = [], []
    for f in files:
        rows = [r for r in json.loads(f.read_text())["rows"] if r.get("error") is not None]
        errors += [r["measured_bytes"] / r["predicted_bytes"] - 1 for r in rows]
        for ran in rows:
            offset = max(0, ran["measured_bytes"] - ran["predicted_bytes"])
            corrected_errors += [r["measured_bytes"] / (r["predicted_bytes"] + offset) - 1 for r in rows
                                 if r is not ran and (r["job"], r["dtype"]) == (ran["job"], ran["dtype"])]
    assert (len(files), len(errors), len(corrected_errors)) == (4, 78, 156)
    assert UNDER_PREDICTION == math.ceil(max(errors) * 1000) / 1000 == 0.46
    assert CALIBRATED_UNDER_PREDICTION == math.ceil(max(corrected_errors) * 1000) / 1000 == 0.127
    assert (FIT_MARGIN, CALIBRATED_MARGIN) == (round(0.46 + MARGIN_HEADROOM, 4), round(0.127 + MARGIN_HEADROOM, 4))


def test_your_configs_trial_corrects_the_trials_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "drive_rates", lambda *a: DriveRates(1e9, 1e9, 5e8, 5e8))
    context = HostContext("cpu", 450 * MiB, engine_bytes=125 * MiB)
    job = job_context(context, STARTUP)
    base = partitioned_in(OffloadKnobs.from_ds_config(NVME_CFG), "bf16")
    runner = FakeRunner(peak_rss_bytes=host_memory(base, JobShape(NUMELS), job).peak_bytes + 200 * MiB)
    search = OffloadSearch(NVME_CFG, runner, budget=Budget(BIG, None, "MemAvailable", Reader([BIG])),  # type: ignore[arg-type]
                           context=context, max_trials=2, max_pairs=1, time_budget_s=3600.0)
    said: list[str] = []
    out = search_offload(search, Target(tmp_path), open_journal(tmp_path / "j", False, ENV), said.append)
    assert out.memory is not None and (out.memory.correction_bytes, out.memory.margin) == (200 * MiB, CALIBRATED_MARGIN)
    [ref, *after] = out.trials
    assert ref.role == "reference" and ref.peak_rss_bytes - ref.predicted_host_bytes == 200 * MiB and after
    fixed = replace(job, correction_bytes=200 * MiB)
    for t in after:                    # predicted with the correction: the model's own peak + 200 MiB
        knobs = partitioned_in(OffloadKnobs.from_ds_config(apply_changes(NVME_CFG, t.changes, "/nvme")), "bf16")
        assert t.predicted_host_bytes == host_memory(knobs, JobShape(NUMELS), fixed).peak_bytes
        assert t.predicted_host_bytes == host_memory(knobs, JobShape(NUMELS), job).peak_bytes + 200 * MiB
    [line] = [s for s in said if s.startswith("offload: host memory corrected on your config's trial: ")]
    assert "every prediction now adds 200.0 MiB" in line and margin_note(CALIBRATED_MARGIN) in line
    text = offload_console(out, RenderOptions())
    assert f"predictions corrected by {units.mb(200 * MiB)} MB: your config's trial peaked at " in text


def test_your_own_config_runs_without_the_margin_and_the_candidates_need_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget your config fits only without the first margin: it runs as
    the reference (you run it already); the candidates are admitted with the
    margin, corrected by its trial."""
    monkeypatch.setattr(search_module, "drive_rates", lambda *a: DriveRates(1e9, 1e9, 5e8, 5e8))
    context = HostContext("cpu", 450 * MiB, engine_bytes=125 * MiB)
    base = partitioned_in(OffloadKnobs.from_ds_config(NVME_CFG), "bf16")
    peak = host_memory(base, JobShape(NUMELS), job_context(context, STARTUP)).peak_bytes
    budget = int(peak * (1 + FIT_MARGIN)) - 1                    # over with the first margin, fits without
    runner = FakeRunner(peak_rss_bytes=peak)
    search = OffloadSearch(NVME_CFG, runner, budget=Budget(budget, None, "MemAvailable", Reader([budget])),  # type: ignore[arg-type]
                           context=context, max_trials=2, max_pairs=1, time_budget_s=3600.0)
    said: list[str] = []
    out = search_offload(search, Target(tmp_path), open_journal(tmp_path / "j", False, ENV), said.append)
    assert out.base_over == () and out.reference_changes == {}
    assert out.trials[0].role == "reference" and out.trials[0].status == "ok"
    assert not any("own config does not fit" in line for line in said)
    assert out.memory is not None and out.memory.margin == CALIBRATED_MARGIN


# -- VmHWM for every trial ---------------------------------------------------------------------------------------------


def test_a_trial_that_failed_before_its_steps_still_has_its_peak() -> None:
    tensors = JobTensors(NUMELS, 1, 0, "", STARTUP)
    assert memory_seen([], tensors) == (0, 0, 1200 * MiB)                  # VmHWM at deepspeed.initialize
    exit_sample = MemorySample(0, 1, 10, 1300 * MiB, 1500 * MiB)
    assert memory_seen([exit_sample], tensors) == (10, 1300 * MiB, 1500 * MiB)
    assert memory_seen([], None) == (0, 0, 0)


def test_a_failed_row_shows_its_peak_beside_the_prediction() -> None:
    failed = OffloadTrial("{}", {}, "failed", "2 of 4 steps", peak_rss_bytes=900_000_000,
                          predicted_host_bytes=800_000_000, role="reference")
    out = OffloadOutcome("a job", {}, (), (), (), (failed,), None, (), "none", "j.jsonl")
    assert "failed: 2 of 4 steps (peak 900.0 MB, predicted 800.0)" in offload_console(out, RenderOptions())
    assert abs((failed.peak_error or 0) - 0.125) < 1e-9


FAKE_DEEPSPEED = '''
def initialize(*args, model=None, **kwargs):
    return model
'''
FAKE_ACCELERATOR = '''
class _A:
    def is_fp16_supported(self):
        return False
def get_accelerator():
    return _A()
'''
JOB = '''
import torch, deepspeed
class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(1000, 1000)          # 4,000,000 + 4,000 B
        self.b = torch.nn.Linear(1000, 1000, bias=False)
        self.b.weight = self.a.weight                 # tied: one storage
        self.c = torch.nn.Parameter(torch.empty(0))   # as deepspeed.zero.Init leaves it: its partition aside
        self.c.ds_tensor = torch.zeros(500)           # 2,000 B
        self.c.ds_numel = 1000
m = Tied()
deepspeed.initialize(model=m, model_parameters=m.parameters(), config={})
raise SystemExit(3)
'''


@needs_deepspeed
def test_the_hook_reports_rss_and_each_parameter_storage_once_at_initialize(tmp_path: Path) -> None:
    """A stand-in deepspeed module (the hook patches whatever `deepspeed`
    imports), real torch tensors: tied weights counted once, a partitioned
    parameter by its ds_tensor; and a memory sample at the exit of a job
    that leaves with an error."""
    fake = tmp_path / "fake"
    (fake / "deepspeed").mkdir(parents=True)
    (fake / "deepspeed" / "__init__.py").write_text(FAKE_DEEPSPEED)
    (fake / "deepspeed" / "accelerator.py").write_text(FAKE_ACCELERATOR)
    (tmp_path / "job.py").write_text(JOB)
    env = hook_env(dict(os.environ), inject_dir(), tmp_path / "events")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{fake}"
    r = subprocess.run([sys.executable, str(tmp_path / "job.py")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 3, r.stderr
    tensors = read_tensors(tmp_path / "events")
    assert tensors is not None and tensors.startup is not None
    assert tensors.numels == (1000, 1_000_000, 1000)            # the module's own parameter first
    assert tensors.startup.param_storage_bytes == 4_000_000 + 4_000 + 2_000
    assert tensors.startup.peak_rss_bytes >= tensors.startup.rss_bytes > 4_006_000
    [at_exit] = read_memory(tmp_path / "events")
    assert at_exit.peak_rss_bytes >= tensors.startup.peak_rss_bytes


@needs_deepspeed
def test_a_trial_that_fails_at_step_2_records_its_peak(tmp_path: Path) -> None:
    """Three optimizer buffers: DeepSpeed 0.19.8 runs step 1 and fails at
    step 2 (`assert pinned_buffers is not None`): a failed trial, its VmHWM
    and VmLck as far as it got."""
    (tmp_path / "swap").mkdir()
    cfg = ds_config(WorkloadSpec(strategy="nvme-opt", size="tiny", nvme_path=str(tmp_path / "swap")))
    cfg["zero_optimization"]["offload_optimizer"]["buffer_count"] = 3
    r = BuiltinRunner("tiny").run(cfg, tmp_path, None, TrialPlan(steps=3, timeout_s=600))
    assert r.status == "failed" and " of 3 steps (exit 1" in r.error, r.error
    assert r.peak_rss_bytes > 300 * MiB and r.locked_bytes > 0
