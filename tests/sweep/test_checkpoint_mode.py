"""`iotune sweep checkpoint` as a mode of the sweep: the options it takes
and refuses (never a built-in model standing in for yours), the request
its options make, its journal kept aside on --fresh or another sweep, and
what --apply writes. The trials themselves: tests/sweep/test_checkpoint_sweep.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.aio import AioSettings
from iotune.model.checkpoint import WriterSettings
from iotune.model.checkpoint_sweep import CandidateResult, CheckpointCandidate, CheckpointOutcome, CheckpointRequest
from iotune.render.registry import render
from iotune.sweep.checkpoint.command import CheckpointArgs, checkpoint_changes, request_for
from iotune.sweep.checkpoint.sweep import open_checkpoint_journal
from iotune.sweep.config import REMOVE
from iotune.sweep.journal import NAME

from tests.project.test_schemas import conforms, strict_json


@pytest.mark.parametrize("argv,says", [
    (["--offload"], "--offload is a sweep of its own now: run `iotune sweep offload`, not iotune sweep checkpoint "
                    "--offload"),
    (["--ds-config", "{cfg}"],
     "--ds-config {cfg} without --steps-cmd would tune a built-in model with your config, not your model: give "
     "--steps-cmd \"YOUR TRAINING COMMAND ... {{config}}\" to run your own job, or name a built-in model with "
     "--model PRESET to tune that one on purpose"),
    (["--apply", "{cfg}"],
     "--apply {cfg} would write what a built-in model's trials chose into your config: give --steps-cmd (with "
     "--ds-config) so the trials run your own job, or name the built-in model with --model to apply its result on "
     "purpose"),
    (["--model", "tiny", "--steps-cmd", "python train.py {{config}}", "--ds-config", "{cfg}"],
     "--model names a built-in model, and --steps-cmd runs your own: give one of them"),
    (["--model", "nope"], "unknown --model 'nope': choose one of tiny, small, medium, wide, 1b, 3b, 8b, 16b"),
    (["--grid"], "--grid is not an option of `iotune sweep checkpoint`: it belongs to `iotune sweep aio`, "
                 "`iotune sweep layouts` and `iotune sweep netfs`"),
    (["--fix", "a=1", "--queue-depths", "8"],
     "--fix is not an option of `iotune sweep checkpoint`: it belongs to `iotune sweep offload`"),
    (["--bed", "latency-bound", "--path", "{dir}"], "--bed excludes --path: give one of them"),
    (["--in-place"], "--in-place says where --apply writes: add --apply DS_CONFIG, or drop --in-place"),
])
def test_refusals_name_the_fix(tmp_path: Path, argv: list[str], says: str) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    r = CliRunner().invoke(cli, ["sweep", "checkpoint", "--path", str(tmp_path),
                                 *[a.format(cfg=cfg, dir=tmp_path) for a in argv]])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines()[-1] == f"Error: {says.format(cfg=cfg)}"


@pytest.mark.parametrize("mode,argv,says", [
    ([], ["--save-at", "3"], "--save-at is not an option of `iotune sweep aio`: it belongs to `iotune sweep "
                             "checkpoint`"),
    (["offload", "--model", "tiny"], ["--dirty-limits", "32M", "--checkpoint-every", "5"],
     "--dirty-limits is not an option of `iotune sweep offload`: it belongs to `iotune sweep checkpoint`"),
])
def test_checkpoint_options_are_refused_by_the_other_sweeps(tmp_path: Path, mode: list[str], argv: list[str],
                                                            says: str) -> None:
    r = CliRunner().invoke(cli, ["sweep", *mode, "--path", str(tmp_path), *argv])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines()[-1] == f"Error: {says}"


def test_the_request_carries_every_option(tmp_path: Path) -> None:
    other = tmp_path / "other"
    args = CheckpointArgs(target_dir=tmp_path, model="wide", checkpoint_dirs=(other,), save_at=3, steps=4,
                          restore_steps=2, every=50, dirty_limits=(32 << 20,), block_sizes=(1 << 20, 8 << 20),
                          repeats=3, steps_timeout_s=600.0)
    q = request_for(args, tmp_path / "scratch", "/sys/fs/cgroup/x", tmp_path / "out")
    assert q == CheckpointRequest(
        swap_dir=str(tmp_path / "scratch"), out_dir=str(tmp_path / "out"), targets=(str(other),), preset="wide",
        save_at=3, measure_steps=4, interval_steps=50, restore_steps=2, repeats=3, dirty_limits=(32 << 20,),
        aio_candidates=(AioSettings(block_size=1 << 20), AioSettings(block_size=8 << 20)), timeout_s=600.0,
        cgroup="/sys/fs/cgroup/x")
    conforms("sweep-checkpoint-1", strict_json(render(CheckpointOutcome(q, (), (), None, None), "json")))
    # without --steps: as many steps after the save as the restore compares (default 3), at least 2
    assert request_for(CheckpointArgs(), tmp_path, None, tmp_path).restore_steps == 3
    assert request_for(CheckpointArgs(), tmp_path, None, tmp_path).measure_steps == 3
    assert request_for(CheckpointArgs(restore_steps=1), tmp_path, None, tmp_path).measure_steps == 2


def test_a_users_job_goes_into_the_request_as_its_argv(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    args = CheckpointArgs(steps_cmd="python3 train.py --deepspeed_config {config} --lr 1e-4", ds_config=cfg)
    q = request_for(args, tmp_path, None, tmp_path)
    assert q.steps_cmd == ("python3", "train.py", "--deepspeed_config", "{config}", "--lr", "1e-4")
    assert q.ds_config == str(cfg)


def test_the_journal_is_kept_aside_on_fresh_and_for_another_sweep(tmp_path: Path) -> None:
    said: list[str] = []
    q = CheckpointRequest(swap_dir=str(tmp_path), out_dir=str(tmp_path))
    open_checkpoint_journal(q, False, said.append)        # the header of q
    open_checkpoint_journal(q, False, said.append)        # the same sweep: resumed, nothing said
    assert said == [] and [p.name for p in tmp_path.glob("*.jsonl")] == [NAME]
    open_checkpoint_journal(CheckpointRequest(swap_dir=str(tmp_path), out_dir=str(tmp_path), save_at=5), False,
                            said.append)
    kept = sorted(p.name for p in tmp_path.glob("journal.*.jsonl"))
    assert len(kept) == 1 and (tmp_path / NAME).exists()
    assert len(said) == 1 and said[0].startswith(f"sweep: the journal in {tmp_path} was recorded with request ")
    assert said[0].endswith(f": starting a new one (the old one is kept as {kept[0]})")
    open_checkpoint_journal(q, True, said.append)
    assert len(list(tmp_path.glob("journal.*.jsonl"))) == 2 and said[-1].startswith(
        "sweep: --fresh: starting a new journal")


def result(candidate: CheckpointCandidate) -> CandidateResult:
    return CandidateResult(candidate, 1, True, 1.0, 1.0, 10.0, 0)


def test_apply_writes_the_writer_block_and_an_aio_block_of_its_own() -> None:
    q = CheckpointRequest(swap_dir="/x", out_dir="/y")
    fast = CheckpointCandidate(WriterSettings("fast", io_buffer_size=16 << 20, io_buffer_double=False),
                               target="/other", dirty_limit_bytes=32 << 20, aio=AioSettings(block_size=8 << 20))
    out = CheckpointOutcome(q, (), (), result(CheckpointCandidate()), result(fast))
    conforms("sweep-checkpoint-1", strict_json(render(out, "json")))
    # dotted keys: the writer block, and the aio keys a sweep decides (never use_gds: the user's)
    assert checkpoint_changes(out) == {
        "checkpoint.writer": {"type": "fast", "io_buffer_size": 16 << 20, "io_buffer_double": False,
                              "io_multiplier": 1},
        "aio.block_size": 8 << 20, "aio.queue_depth": 8, "aio.intra_op_parallelism": 1, "aio.single_submit": False,
        "aio.overlap_events": True}
    # DeepSpeed's defaults (torch.save, the job's aio): a writer block in the config is removed, as the trial
    # ran it, and nothing else; nothing that restores: nothing to write
    assert checkpoint_changes(CheckpointOutcome(q, (), (), None, result(CheckpointCandidate()))) == {
        "checkpoint.writer": REMOVE}
    assert checkpoint_changes(CheckpointOutcome(q, (), (), None, None)) == {}
