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
from dataclasses import replace
from pathlib import Path

import pytest

from iotune.errors import UsageError
from iotune.model.checkpoint import WriterSettings
from iotune.model.checkpoint_sweep import (DEFAULTS, CandidateResult, CheckpointCandidate, CheckpointOutcome,
                                           CheckpointRequest, CheckpointTrial, RestoreCheck)
from iotune.render.registry import render
from iotune.sweep.checkpoint.space import CPU_FAST_WRITER
from iotune.sweep.checkpoint.sweep import better, run_checkpoint_sweep, summarize
from iotune.sweep.checkpoint.trial import (Run, base_config, candidate_changes, check_restore, restore_run,
                                          run_trial, save_run)
from iotune.sweep.user_job import JobRun
from iotune.resources import inject_dir
from iotune.sweep.config import candidate_config

from tests.conftest import needs_deepspeed
from tests.project.test_schemas import conforms, strict_json

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
    conforms("sweep-checkpoint-1", strict_json(render(out, "json")))
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
    conforms("sweep-checkpoint-1", strict_json(render(out, "json")))
    assert "No recommendation" in render(out, "console")


def restore(weights: bool | None, optimizer: bool | None) -> RestoreCheck:
    """A check as check_restore makes it: 3 steps compared, the first for the weights."""
    lost = weights and optimizer is False
    reason = ("" if weights and optimizer is not False else
              "weights restored, optimizer state NOT restored (Adam restarted): loss after the restore 5.6 != 5.5 "
              "of the uninterrupted run at step 4 (relative difference 0.0182)" if lost else
              "loss after the restore 6.1 != 6.0 of the uninterrupted run at step 3 (relative difference 0.0167): "
              "the weights were not restored")
    got = (6.0 if weights else 6.1, 5.5 if optimizer else 5.6, 5.0 if optimizer else 4.7)
    return RestoreCheck(not reason, (6.0, 5.5, 5.0), got, None, True, 0.5, reason, weights, optimizer, 1)


def checked(c: CheckpointCandidate, save_s: float, weights: bool, optimizer: bool | None) -> CheckpointTrial:
    return replace(trial(c, save_s), restore=restore(weights, optimizer))


def test_a_checkpoint_that_loses_the_optimizer_state_is_not_recommended(tmp_path: Path) -> None:
    """The python writer saves faster but its restore restarted Adam: the
    defaults, which restore both, are picked; each row says what restored."""
    trials = {DEFAULTS: checked(DEFAULTS, 3.0, True, True), PYTHON: checked(PYTHON, 0.5, True, False)}
    out = run_checkpoint_sweep(request(tmp_path, writers=(WriterSettings("python"),)),
                               runner=lambda req, c, r: trials[c])
    assert out.best is not None and out.best.candidate == DEFAULTS and out.best.restore_rank == 2
    [python] = [r for r in out.results if r.candidate == PYTHON]
    assert (python.restores, python.weights_restored, python.optimizer_restored) == (False, True, False)
    assert out.notes == ()
    text = render(out, "console")
    assert "torch.save" in text and "restores (weights and optimizer state)" in text
    assert "python writer" in text and "weights restored, optimizer state NOT restored (Adam restarted)" in text
    assert "the weights on the first (exact losses), the optimizer state on the 2 after it (relative tolerance " \
           "1e-05)" in text
    doc = strict_json(render(out, "json"))
    conforms("sweep-checkpoint-1", doc)
    assert [(r["weights_restored"], r["optimizer_restored"]) for r in doc["results"]] == [(True, True), (True, False)]
    assert doc["results"][1]["check"]["got"] == [6.0, 5.6, 4.7]            # the losses compared


def test_when_every_candidate_loses_the_optimizer_state_the_pick_is_by_the_weights_and_said_once(
        tmp_path: Path) -> None:
    trials = {DEFAULTS: checked(DEFAULTS, 3.0, True, False), PYTHON: checked(PYTHON, 1.5, True, False),
              FAST: checked(FAST, 0.5, False, None)}
    out = run_checkpoint_sweep(request(tmp_path, writers=(WriterSettings("python"), WriterSettings("fast"))),
                               runner=lambda req, c, r: trials[c])
    assert out.best is not None and out.best.candidate == PYTHON and out.best.restore_rank == 1
    [note] = out.notes              # the built-in workload's optimizer is on NVMe: the lint rule is named
    assert note.startswith("no candidate restored the optimizer state: every checkpoint that restored the weights "
                           "lost it. DeepSpeed 0.19.8 restarts Adam") and "checkpoint-nvme-optimizer-restart" in note
    text = render(out, "console")
    assert text.count("checkpoint-nvme-optimizer-restart") == 1
    assert "Pick: python writer, saves 2.00x as fast as DeepSpeed's defaults (by the weights alone" in text
    assert "not picked: loss after the restore 6.1 != 6.0" in text        # weights not restored: never picked


def test_restoring_both_outranks_any_cost_and_the_weights_outrank_nothing() -> None:
    def result(save: float, weights: bool | None, optimizer: bool | None) -> CandidateResult:
        return CandidateResult(DEFAULTS, 1, bool(weights) and optimizer is not False, save, 1.0, 10 + save, 0, "",
                               save, 0.0, weights, optimizer)

    both, weights_only, nothing = result(5.0, True, True), result(1.0, True, False), result(0.1, False, None)
    assert (both.restore_rank, weights_only.restore_rank, nothing.restore_rank) == (2, 1, 0)
    assert better(both, weights_only) and not better(weights_only, both)
    assert better(weights_only, nothing) and not better(nothing, weights_only)
    assert result(5.0, True, None).restore_rank == 2            # --restore-steps 1: the optimizer not checked


def _run(losses: list[float], returncode: int = 0) -> Run:
    return Run(JobRun(returncode, 1.0, "", "", "" if returncode == 0 else "RuntimeError: boom"), None,
               tuple(losses))


NVME = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}


@pytest.mark.parametrize("got,weights,optimizer,reason", [
    ([6.0, 5.5 * (1 + 6e-7), 5.0], True, True, ""),                        # CPU Adam's pow() after a load
    ([6.0, 5.6, 4.7], True, False, "weights restored, optimizer state NOT restored (Adam restarted): loss after "
                                   "the restore 5.6 != 5.5 of the uninterrupted run at step 4 (relative difference "
                                   "0.0182), beyond 1e-05"),
    ([6.0 * (1 + 1e-7), 5.5, 5.0], False, None, "loss after the restore 6.0000006 != 6.0 of the uninterrupted run "
                                                "at step 3 (relative difference 1e-07): the weights were not "
                                                "restored"),
    ([6.0], True, None, "the restored run failed before its step 2 (exit 1): RuntimeError: boom"),
])
def test_the_restore_check_tells_the_weights_from_the_optimizer_state(got: list[float], weights: bool,
                                                                     optimizer: bool | None, reason: str) -> None:
    req = CheckpointRequest(swap_dir="/x", out_dir="/y", save_at=2)
    check = check_restore(req, NVME, _run([7.0, 6.5, 6.0, 5.5, 5.0]), _run(got, 0 if len(got) == 3 else 1))
    assert (check.weights_restored, check.optimizer_restored, check.reason) == (weights, optimizer, reason)
    assert check.restored is (reason == "") and check.weights_losses == 1
    assert check.expected == (6.0, 5.5, 5.0) and check.got == tuple(got)


def test_the_weights_are_the_first_steps_micro_batches_and_one_step_checks_only_them() -> None:
    gas = {"gradient_accumulation_steps": 2}
    req = CheckpointRequest(swap_dir="/x", out_dir="/y", save_at=1, restore_steps=2)
    check = check_restore(req, gas, _run([9.0, 8.0, 7.0, 6.5, 6.0, 5.5]), _run([7.0, 6.5, 6.1, 5.5]))
    assert (check.weights_restored, check.optimizer_restored, check.weights_losses) == (True, False, 2)
    assert "(Adam restarted)" not in check.reason and "at step 3" in check.reason     # not an NVMe optimizer
    one = check_restore(replace(req, restore_steps=1), gas, _run([9.0, 8.0, 7.0, 6.5]), _run([7.0, 6.5]))
    assert (one.restored, one.weights_restored, one.optimizer_restored) == (True, True, None)
    assert one.verdict() == "restores the weights (optimizer state not checked: one step compared)"


def test_records_of_an_older_iotune_load_with_what_they_lack_unknown() -> None:
    old = {"restored": True, "expected": [6.0], "got": [6.0], "max_rel_diff": 0.0, "loaded": True, "load_s": 0.1,
           "reason": ""}
    check = RestoreCheck.from_json(old)
    assert (check.weights_restored, check.optimizer_restored, check.weights_ok) == (None, None, True)
    r = CandidateResult.from_json({"candidate": {}, "trials": 1, "restores": True, "save_s": 1.0, "load_s": 0.1,
                                   "interval_s": 10.0, "not_durable_bytes": 0})
    assert (r.weights_restored, r.optimizer_restored, r.check, r.restore_rank) == (None, None, None, 2)
    t = CheckpointTrial.from_json({"candidate": {}, "repeat": 0, "status": "ok", "restore": old})
    assert t.restores and summarize(DEFAULTS, [t], 10).weights_restored is True
    assert CheckpointRequest.from_json({"swap_dir": "/x", "out_dir": "/y", "restore_steps": 1}).restore_steps == 1


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


def user_request(tmp_path: Path, argv: tuple[str, ...], **kw: object) -> CheckpointRequest:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    return request(tmp_path, steps_cmd=argv, ds_config=str(cfg), **kw)


def test_refusals_are_said_once_with_their_count_and_the_lint_rules_reason(tmp_path: Path) -> None:
    """A `python` job on the CPU accelerator: the four fast writers cannot
    run (checkpoint-fast-writer-cpu), the python writer cannot either
    (checkpoint-writer-launcher: no CROSS_RANK/CROSS_SIZE); each reason is
    said once, before anything of theirs runs."""
    said: list[str] = []
    ran: list[CheckpointCandidate] = []

    def runner(req: CheckpointRequest, c: CheckpointCandidate, repeat: int) -> CheckpointTrial:
        ran.append(c)
        return checked(c, 1.0, True, True)

    out = run_checkpoint_sweep(user_request(tmp_path, ("python", "train.py", "--deepspeed_config", "{config}")),
                               said.append, runner)
    assert ran == [DEFAULTS]
    refusals = [x for x in said if "refused" in x]
    assert refusals == [
        "checkpoint: refused before running: python writer: a writer block reads CROSS_RANK and CROSS_SIZE, which "
        "only the deepspeed launcher sets: under torchrun or a plain `python` DeepSpeed fails at start-up with "
        "KeyError: 'CROSS_SIZE' (lint rule checkpoint-writer-launcher), and --steps-cmd starts the job with a plain "
        "`python`: start it with the deepspeed launcher, or export CROSS_RANK=0 and CROSS_SIZE=1 (one node) where "
        "you run the sweep and your job",
        "checkpoint: refused before running: 4 candidates (fast writer (64 MiB double), fast writer (16 MiB double), "
        "fast writer (64 MiB single), fast writer (64 MiB double), decoupled): " + CPU_FAST_WRITER]
    text = render(out, "console")
    assert text.count("lint rule checkpoint-fast-writer-cpu") == 1 and text.count("refused (2)") == 4
    assert "  (2) refused before running, 4 candidates: DeepSpeed 0.19.8's fast writer cannot run" in text
    assert "  python writer " in text and "refused (1)" in text


@pytest.mark.parametrize("argv,env,runs", [
    (("deepspeed", "train.py", "{config}"), False, True),          # the launcher sets CROSS_RANK and CROSS_SIZE
    (("python", "-m", "deepspeed.launcher.runner", "train.py", "{config}"), False, True),
    (("torchrun", "--nproc-per-node", "2", "train.py", "{config}"), False, False),
    (("python3.11", "train.py", "{config}"), True, True),          # exported where the sweep runs: the job has them
    (("bash", "run.sh", "{config}"), False, True),                  # another wrapper: not known, run
])
def test_a_writer_block_runs_only_where_the_launcher_sets_what_it_reads(tmp_path: Path, argv: tuple[str, ...],
                                                                       env: bool, runs: bool) -> None:
    ran: list[CheckpointCandidate] = []

    def runner(req: CheckpointRequest, c: CheckpointCandidate, repeat: int) -> CheckpointTrial:
        ran.append(c)
        return checked(c, 1.0, True, True)

    run_checkpoint_sweep(user_request(tmp_path, argv, writers=(WriterSettings("python"),), launcher_vars=env),
                         runner=runner)
    assert (PYTHON in ran) is runs


def test_bad_requests_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a directory: create it"):
        run_checkpoint_sweep(request(tmp_path, targets=(str(tmp_path / "nowhere"),)))
    with pytest.raises(UsageError, match="interval .* is shorter than the steps measured"):
        run_checkpoint_sweep(request(tmp_path, interval_steps=1, measure_steps=2))
    with pytest.raises(UsageError, match="no \\{config\\} placeholder"):
        run_checkpoint_sweep(request(tmp_path, steps_cmd=("python", "train.py"), ds_config="x.json"))


# -- real saves and restores ----------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckpointRequest, Path, object]:
    """One real save of the built-in workload (tiny, NVMe optimizer), after step 2 of 3."""
    tmp = tmp_path_factory.mktemp("saved")
    req = CheckpointRequest(swap_dir=str(tmp / "swap"), out_dir=str(tmp / "out"), measure_steps=1, restore_steps=1)
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
    assert (check.weights_restored, check.optimizer_restored) == (True, None)        # one step: the weights only


@needs_deepspeed
def test_a_truncated_file_and_a_missing_rank_directory_do_not_restore(
        saved: tuple[CheckpointRequest, Path, object]) -> None:
    req, tmp, run = saved
    # the fp32 master weights' file (the moments' files are never read back: see the next test)
    [swp] = [p for p in (tmp / "ckpt").glob("global_step2/offloaded_tensors/rank00/*.tensor.swp")
             if not p.name.startswith("exp_avg")]
    data = swp.read_bytes()
    swp.write_bytes(data[: len(data) // 2])
    try:
        truncated = _restore(req, tmp, run, "truncated")
    finally:
        swp.write_bytes(data)                  # the saved checkpoint, whole again for the next test
    # DeepSpeed loads the short file without an error and trains on: only the loss tells
    assert truncated.loaded is True and not truncated.restored and truncated.weights_restored is False
    assert truncated.reason.startswith("loss after the restore") and f"!= {truncated.expected[0]!r}" in truncated.reason
    assert truncated.reason.endswith("the weights were not restored")
    rank = tmp / "ckpt" / "global_step2" / "offloaded_tensors" / "rank00"
    rank.rename(rank.with_name("gone"))
    try:
        missing = _restore(req, tmp, run, "missing")
    finally:
        rank.with_name("gone").rename(rank)
    assert not missing.restored and missing.reason.startswith("load_checkpoint raised FileNotFoundError")
    assert "offloaded_tensors/rank00" in missing.reason


@pytest.fixture(scope="module")
def mock_swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckpointRequest, CheckpointOutcome]:
    """One real sweep of the built-in workload (tiny, NVMe optimizer): DeepSpeed's defaults, then the mock
    writer. Its trial of the defaults is the restore check as the sweep runs it (the next test's)."""
    req = request(tmp_path_factory.mktemp("mock-swept"), writers=(WriterSettings("mock"),), measure_steps=1,
                  interval_steps=5)
    return req, run_checkpoint_sweep(req)


@needs_deepspeed
def test_nvme_offload_restores_the_weights_but_restarts_adam(
        mock_swept: tuple[CheckpointRequest, CheckpointOutcome]) -> None:
    """The restore check, as the sweep runs it (3 steps after the load), on
    the built-in workload with its optimizer on NVMe: the first step is exact
    (the weights), the second differs (DeepSpeed 0.19.8 never reads the copied
    moments back and loses Adam's step count: lint's
    checkpoint-nvme-optimizer-restart); the check says so and does not call
    the checkpoint restored. (The sweep's own trial of the defaults, shared
    with test_a_real_sweep_never_picks_the_mock_writer: one real trial, not two.)"""
    req, out = mock_swept
    assert req.restore_steps == 3 and req.strategy == "nvme-opt"
    [t] = [t for t in out.trials if t.candidate == DEFAULTS]
    assert t.ok and t.restore is not None, t.error
    r = t.restore
    assert (r.weights_restored, r.optimizer_restored, r.restored) == (True, False, False), r
    assert r.expected[0] == r.got[0] and r.weights_rel_diff == 0.0          # the next step: exact
    assert r.optimizer_rel_diff is not None and r.optimizer_rel_diff > 1e-3  # a restart, far beyond 1e-5
    assert r.reason.startswith("weights restored, optimizer state NOT restored (Adam restarted): loss after the "
                               f"restore {r.got[1]!r} != {r.expected[1]!r} of the uninterrupted run at step 4")
    assert r.verdict() == "weights restored, optimizer state NOT restored (Adam restarted)" and not t.restores
    print(f"\nlosses after the load: uninterrupted {r.expected}, restored {r.got}")


@needs_deepspeed
def test_cpu_offload_restores_the_moments_too(tmp_path: Path) -> None:
    """ZeRO-2 with the optimizer in RAM (offload to cpu): the later steps after
    the restore match as well, within the optimizer tolerance (DeepSpeed's
    CPU Adam recomputes its bias corrections with pow() after the load: a
    few float roundings)."""
    t = run_trial(request(tmp_path, strategy="cpu"), DEFAULTS, 0)
    assert t.ok and t.restore is not None and t.restore.restored, t.restore
    assert (t.restore.weights_restored, t.restore.optimizer_restored) == (True, True)
    assert t.restore.expected[0] == t.restore.got[0] and (t.restore.max_rel_diff or 0) < 1e-6
    assert t.restore.verdict() == "restores (weights and optimizer state)"


@needs_deepspeed
def test_a_users_job_that_starts_its_data_over_is_compared_on_the_replayed_batches(tmp_path: Path) -> None:
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(subprocess.run([sys.executable, "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
                                   "--size", "tiny", "--nvme-path", str(tmp_path), "--print-config"],
                                  capture_output=True, text=True, check=True).stdout)
    job = (sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config", "{config}", "--size",
           "tiny", "--steps", "20")
    t = run_trial(request(tmp_path, steps_cmd=job, ds_config=str(cfg), measure_steps=1, restore_steps=1), DEFAULTS, 0)
    assert t.ok, t.error
    assert t.restore is not None and t.restore.restored and t.restore.max_rel_diff == 0.0, t.restore
    assert t.part_bytes["offloaded tensors"] == 12 * 3_688_704


GPT_JOB = Path(__file__).resolve().parents[1] / "data" / "gpt_job.py"


@needs_deepspeed
def test_a_job_with_dropout_drawing_its_batches_from_torchs_generator_restores_like_for_like(tmp_path: Path) -> None:
    """The held-out GPT-2 job: dropout 0.1 (transformers' default), each batch
    drawn with torch.randint from torch's global generator right before its
    forward, data that starts over in the restored process. The hook replays
    the captured batches with the generators' states of each forward, so
    both runs draw the same dropout masks: the first step after the load is
    bit-exact (the same float operations, in the same order, on the same
    weights, inputs and random draws: any difference would be a real one),
    and with the optimizer in RAM the later steps match within the optimizer
    tolerance. (Seeded right after the load instead, the restored run's
    masks came from another point of the stream: 'does NOT restore'.)"""
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    job = (sys.executable, "-W", "ignore", str(GPT_JOB), "--deepspeed_config", "{config}", "--width", "256")
    t = run_trial(request(tmp_path, steps_cmd=job, ds_config=str(cfg)), DEFAULTS, 0)
    assert t.ok, t.error
    r = t.restore
    assert r is not None and r.restored and (r.weights_restored, r.optimizer_restored) == (True, True), r
    assert r.got[0] == r.expected[0] and r.weights_rel_diff == 0.0                      # bit-exact
    assert r.optimizer_rel_diff is not None and r.optimizer_rel_diff <= 1e-6
    print(f"\nlosses after the load: uninterrupted {r.expected}, restored {r.got}")


@needs_deepspeed
def test_a_real_sweep_never_picks_the_mock_writer(mock_swept: tuple[CheckpointRequest, CheckpointOutcome]) -> None:
    req, out = mock_swept
    mock = next(r for r in out.results if r.candidate.writer.kind == "mock")
    # the mock engine writes no state: the load finds nothing, or an empty file (EOFError), by the run
    assert not mock.restores and mock.restore_rank == 0 and mock.reason.startswith((
        "load_checkpoint found no checkpoint to load", "load_checkpoint raised EOFError")), mock.reason
    # the optimizer on NVMe: the defaults restore the weights and restart Adam, and nothing does better: the
    # pick is by the weights, and the outcome says why, once, citing the lint rule
    d = out.defaults
    assert d is not None and (d.weights_restored, d.optimizer_restored) == (True, False)
    assert out.best is not None and out.best.candidate == DEFAULTS and out.best.restore_rank == 1
    assert sum("checkpoint-nvme-optimizer-restart" in n for n in out.notes) == 1
    doc = strict_json(render(out, "json"))
    conforms("sweep-checkpoint-1", doc)
    best = doc["best"]
    assert (best["restores"], best["weights_restored"], best["optimizer_restored"]) == (False, True, False)
    text = render(out, "console")
    assert "weights restored, optimizer state NOT restored (Adam restarted)" in text
    assert "Pick: torch.save" in text and "by the weights alone" in text
    assert not list(Path(req.swap_dir).iterdir())        # every trial's swap and checkpoint removed
    os.sync()


@needs_deepspeed
def test_the_hook_replays_every_generator_a_forward_may_draw_from(tmp_path: Path) -> None:
    """The startup hook's capture at a forward and its replay before the
    corresponding forward of the restored run, in a process of their own (the
    hook is what a job imports): torch's, Python's and numpy's global
    generators draw, after the replay, what they drew after the capture."""
    script = f"""
import random, sys
import numpy, torch
sys.path.insert(0, {str(inject_dir())!r})
import _iotune_ckpt as hook
torch.manual_seed(1); random.seed(2); numpy.random.seed(3)
hook._capture({str(tmp_path / "0.pt")!r}, (torch.ones(2),), {{"labels": None}})
first = (torch.rand(3).tolist(), random.random(), numpy.random.rand())
torch.manual_seed(9); random.seed(9); numpy.random.seed(9)
args, kwargs = hook._replay({str(tmp_path / "0.pt")!r}, (), {{}})
again = (torch.rand(3).tolist(), random.random(), numpy.random.rand())
assert args[0].tolist() == [1.0, 1.0] and kwargs == {{"labels": None}}
print(first == again)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
