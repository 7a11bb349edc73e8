"""The checkpoint sweep through its API (iotune.sweep.checkpoint.sweep): the search,
the pick and the journal on hand-built trials; the restore check on real
saves of the built-in workload, whole and broken (a truncated file, a
missing rank directory); a user's job whose data loader starts over,
restored and compared on the replayed batches; a real sweep end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iotune.errors import UsageError
from iotune.model.checkpoint import WriterSettings
from iotune.model.checkpoint_sweep import (DEFAULTS, CandidateResult, CheckpointCandidate, CheckpointOutcome,
                                           CheckpointRequest, CheckpointTrial, RestoreCheck)
from iotune.render.registry import render
from iotune.sweep.checkpoint.sweep import better, run_checkpoint_sweep, summarize
from iotune.sweep.checkpoint.trial import (base_config, candidate_changes, check_restore, restore_run, run_trial,
                                          save_run)
from iotune.sweep.config import candidate_config

from tests.conftest import needs_deepspeed

PYTHON = CheckpointCandidate(WriterSettings("python"))
FAST = CheckpointCandidate(WriterSettings("fast"))


def trial(c: CheckpointCandidate, save_s: float, restores: bool = True, repeat: int = 0) -> CheckpointTrial:
    check = RestoreCheck(restores, (6.0,), (6.0 if restores else 5.0,), 0.0 if restores else 0.2, True, 0.5,
                         "" if restores else "loss after the restore 5.0 != 6.0")
    return CheckpointTrial(c, repeat, "ok", "", save_s, 100, {"offloaded tensors": 90}, {}, 10, (1.0, 1.0),
                           (1.5, 1.0), check)


def request(tmp_path: Path, **kw: object) -> CheckpointRequest:
    (tmp_path / "swap").mkdir(exist_ok=True)
    return CheckpointRequest(swap_dir=str(tmp_path / "swap"), out_dir=str(tmp_path / "out"), **kw)  # type: ignore[arg-type]


def test_the_interval_cost_charges_what_the_save_leaves_to_the_next_steps() -> None:
    t = trial(DEFAULTS, 2.0)
    # save 2 s + the 2 measured steps (1.5 + 1.0 s) + 8 more steps at the 1.0 s before the save
    assert t.interval_s(10) == pytest.approx(2.0 + 2.5 + 8 * 1.0)
    assert t.overhead_s() == pytest.approx(2.0 + 0.5)          # what the checkpoint adds: the save and 0.5 s of writeback
    r = summarize(DEFAULTS, [trial(DEFAULTS, 2.0), trial(DEFAULTS, 4.0, repeat=1), trial(DEFAULTS, 3.0, repeat=2)], 10)
    assert (r.save_s, r.trials, r.restores) == (3.0, 3, True)
    assert not summarize(DEFAULTS, [trial(DEFAULTS, 2.0), trial(DEFAULTS, 1.0, False, 1)], 10).restores


def test_a_difference_the_step_jitter_explains_keeps_the_earlier_choice() -> None:
    def result(c: CheckpointCandidate, overhead: float, save: float, dirty: int) -> CandidateResult:
        return CandidateResult(c, 1, True, save, 1.0, 10 + overhead, dirty, "", overhead, jitter_s=1.0)

    defaults = result(DEFAULTS, 2.0, 2.5, 490_000_000)
    assert not better(result(PYTHON, 1.5, 2.5, 490_000_000), defaults)      # 0.5 s better: within 1 s of jitter
    assert better(result(PYTHON, 0.5, 1.0, 490_000_000), defaults)          # 1.5 s better: beyond it
    limited = CheckpointCandidate(dirty_limit_bytes=32 << 20)
    # within the noise, as fast to save and most of it durable at return: the more durable one
    assert better(result(limited, 2.4, 2.6, 20_000_000), defaults)
    assert not better(result(limited, 2.4, 3.0, 20_000_000), defaults)      # 20 % slower to save
    assert not better(result(limited, 2.4, 2.5, 300_000_000), defaults)     # not half as much left dirty


def test_a_checkpoint_that_does_not_restore_is_never_picked(tmp_path: Path) -> None:
    runs: list[str] = []

    def runner(req: CheckpointRequest, c: CheckpointCandidate, repeat: int) -> CheckpointTrial:
        runs.append(c.writer.label())
        return {DEFAULTS: trial(DEFAULTS, 3.0), PYTHON: trial(PYTHON, 1.5), FAST: trial(FAST, 0.5, False)}[c]

    req = request(tmp_path, writers=(WriterSettings("python"), WriterSettings("fast")))
    out = run_checkpoint_sweep(req, runner=runner)
    assert runs == ["torch.save", "python writer", "fast writer (64 MiB double)"]
    # 1.5 s less overhead, beyond the 0.5 s step jitter x the 2 steps measured after the save
    assert out.best is not None and out.best.candidate == PYTHON and out.save_speedup == pytest.approx(2.0)
    assert [r.restores for r in out.results] == [True, True, False]
    assert "does not use the aio block" in out.aio_statement
    # every trial journaled; the same request resumes without running anything again
    lines = (tmp_path / "out" / "journal.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["header", *["checkpoint-trial"] * 3]
    again = run_checkpoint_sweep(req, runner=lambda *a: pytest.fail("ran a trial the journal holds"))
    assert again.best == out.best
    assert CheckpointOutcome.from_json(json.loads(json.dumps(out.to_json()))) == out
    text = render(out, "console")
    assert "Pick: python writer, saves 2.00x as fast as DeepSpeed's defaults" in text
    assert '"checkpoint": {"writer": {"type": "python"}}' in text
    assert "not picked: loss after the restore 5.0 != 6.0" in text
    said: list[str] = []                   # another request starts a new journal, keeping the old one
    run_checkpoint_sweep(request(tmp_path, writers=(WriterSettings("python"),), save_at=3), said.append, runner)
    assert "was recorded with request " in said[0] and len(list((tmp_path / "out").glob("journal.*.jsonl"))) == 1


def test_nothing_is_picked_when_nothing_restores_and_the_defaults_are_named(tmp_path: Path) -> None:
    out = run_checkpoint_sweep(request(tmp_path, writers=(WriterSettings("python"),)),
                               runner=lambda req, c, r: trial(c, 1.0, False))
    assert out.best is None
    assert any("DeepSpeed's defaults do not restore this job either" in n for n in out.notes)
    assert "No recommendation" in render(out, "console")


def test_candidates_deepspeed_would_refuse_are_refused_before_running(tmp_path: Path) -> None:
    odd = WriterSettings("fast", 1_000_000)
    out = run_checkpoint_sweep(request(tmp_path, writers=(odd,)), runner=lambda req, c, r: trial(c, 1.0))
    [refused] = [t for t in out.trials if t.status == "refused"]
    assert refused.candidate.writer == odd and "not a multiple of 1,024 B" in refused.error
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    (tmp_path / "user").mkdir()
    user = request(tmp_path / "user", writers=(WriterSettings("fast"),), steps_cmd=("train", "{config}"),
                   ds_config=str(cfg))
    out = run_checkpoint_sweep(user, runner=lambda req, c, r: trial(c, 1.0))
    [refused] = [t for t in out.trials if t.status == "refused"]
    assert "cannot run on the CPU accelerator" in refused.error and out.best is not None
    assert out.best.candidate == DEFAULTS


def test_bad_requests_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a directory: create it"):
        run_checkpoint_sweep(request(tmp_path, targets=(str(tmp_path / "nowhere"),)))
    with pytest.raises(UsageError, match="interval .* is shorter than the steps measured"):
        run_checkpoint_sweep(request(tmp_path, interval_steps=1, measure_steps=2))
    with pytest.raises(UsageError, match="measure at least as many steps as are compared"):
        run_checkpoint_sweep(request(tmp_path, restore_steps=2, measure_steps=1))
    with pytest.raises(UsageError, match="no \\{config\\} placeholder"):
        run_checkpoint_sweep(request(tmp_path, steps_cmd=("python", "train.py"), ds_config="x.json"))


# -- real saves and restores ----------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckpointRequest, Path, object]:
    """One real save of the built-in workload (tiny, NVMe optimizer), after step 2 of 3."""
    tmp = tmp_path_factory.mktemp("saved")
    req = CheckpointRequest(swap_dir=str(tmp / "swap"), out_dir=str(tmp / "out"), measure_steps=1)
    (tmp / "swap").mkdir()
    (tmp / "swap" / "save").mkdir()
    config = candidate_config(base_config(req), candidate_changes(DEFAULTS), tmp / "swap" / "save")
    run = save_run(req, DEFAULTS, config, tmp / "work-save", tmp / "ckpt")
    assert run.job.returncode == 0, run.job.stderr
    return req, tmp, run


def _restore(req: CheckpointRequest, tmp: Path, saved_run: object, name: str) -> RestoreCheck:
    (tmp / "swap" / name).mkdir()
    config = candidate_config(base_config(req), candidate_changes(DEFAULTS), tmp / "swap" / name)
    run = restore_run(req, DEFAULTS, config, tmp / f"work-{name}", tmp / "ckpt")
    return check_restore(req, config, saved_run, run)  # type: ignore[arg-type]


@needs_deepspeed
def test_a_whole_checkpoint_restores_to_the_exact_next_loss(saved: tuple[CheckpointRequest, Path, object]) -> None:
    req, tmp, run = saved
    check = _restore(req, tmp, run, "whole")
    assert check.restored and check.loaded is True and check.max_rel_diff == 0.0
    assert check.expected == check.got and len(check.got) == 1 and check.load_s is not None


@needs_deepspeed
def test_a_truncated_file_and_a_missing_rank_directory_do_not_restore(
        saved: tuple[CheckpointRequest, Path, object]) -> None:
    req, tmp, run = saved
    # the fp32 master weights' file (the moments' files are never read back: see the next test)
    [swp] = [p for p in (tmp / "ckpt").glob("global_step2/offloaded_tensors/rank00/*.tensor.swp")
             if not p.name.startswith("exp_avg")]
    data = swp.read_bytes()
    swp.write_bytes(data[: len(data) // 2])
    truncated = _restore(req, tmp, run, "truncated")
    swp.write_bytes(data)
    # DeepSpeed loads the short file without an error and trains on: only the loss tells
    assert truncated.loaded is True and not truncated.restored
    assert truncated.reason.startswith("loss after the restore") and f"!= {truncated.expected[0]!r}" in truncated.reason
    rank = tmp / "ckpt" / "global_step2" / "offloaded_tensors" / "rank00"
    rank.rename(rank.with_name("gone"))
    try:
        missing = _restore(req, tmp, run, "missing")
    finally:
        rank.with_name("gone").rename(rank)
    assert not missing.restored and missing.reason.startswith("load_checkpoint raised FileNotFoundError")
    assert "offloaded_tensors/rank00" in missing.reason


@needs_deepspeed
def test_nvme_offload_restores_the_weights_but_restarts_adam(tmp_path: Path) -> None:
    """The second step after the restore differs: DeepSpeed 0.19.8 never reads
    the copied moments back, and loses Adam's step count (lint's
    checkpoint-nvme-optimizer-restart)."""
    t = run_trial(request(tmp_path, restore_steps=2, measure_steps=2), DEFAULTS, 0)
    assert t.ok and t.restore is not None and not t.restore.restored
    assert t.restore.expected[0] == t.restore.got[0]                    # the next step: exact
    assert t.restore.expected[1] != t.restore.got[1] and "at step 4" in t.restore.reason


@needs_deepspeed
def test_cpu_offload_restores_the_moments_too(tmp_path: Path) -> None:
    """ZeRO-2 with the optimizer in RAM (offload to cpu): the second step after
    the restore matches as well, within float rounding (the lint fix's claim)."""
    t = run_trial(request(tmp_path, strategy="cpu", restore_steps=2, loss_rel_tol=1e-5, measure_steps=2), DEFAULTS, 0)
    assert t.ok and t.restore is not None and t.restore.restored, t.restore
    assert t.restore.expected[0] == t.restore.got[0] and (t.restore.max_rel_diff or 0) < 1e-6


@needs_deepspeed
def test_a_users_job_that_starts_its_data_over_is_compared_on_the_replayed_batches(tmp_path: Path) -> None:
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(subprocess.run([sys.executable, "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
                                   "--size", "tiny", "--nvme-path", str(tmp_path), "--print-config"],
                                  capture_output=True, text=True, check=True).stdout)
    job = (sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config", "{config}", "--size",
           "tiny", "--steps", "20")
    t = run_trial(request(tmp_path, steps_cmd=job, ds_config=str(cfg), measure_steps=1), DEFAULTS, 0)
    assert t.ok, t.error
    assert t.restore is not None and t.restore.restored and t.restore.max_rel_diff == 0.0, t.restore
    assert t.part_bytes["offloaded tensors"] == 12 * 3_688_704


@needs_deepspeed
def test_a_real_sweep_never_picks_the_mock_writer(tmp_path: Path) -> None:
    req = request(tmp_path, writers=(WriterSettings("mock"),), measure_steps=1, interval_steps=5)
    out = run_checkpoint_sweep(req)
    mock = next(r for r in out.results if r.candidate.writer.kind == "mock")
    # the mock engine writes no state: the load finds nothing, or an empty file (EOFError), by the run
    assert not mock.restores and mock.reason.startswith(("load_checkpoint found no checkpoint to load",
                                                         "load_checkpoint raised EOFError")), mock.reason
    assert out.defaults is not None and out.defaults.restores
    assert out.best is not None and out.best.candidate == DEFAULTS
    assert json.loads(render(out, "json"))["best"]["restores"] is True
    assert not list(Path(req.swap_dir).iterdir())        # every trial's swap and checkpoint removed
    os.sync()
