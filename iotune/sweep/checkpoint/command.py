"""`iotune sweep checkpoint`: the options, parsed (CheckpointArgs), turned
into a CheckpointRequest on the drive to tune (--path, or a test bed whose
caps the trials' processes join), the sweep run (iotune.sweep.checkpoint.sweep)
with its journal in -o/--out (default: iotune-sweeps/checkpoint-<hash of the
drive and the job>), and the pick's changes for --apply.

Like `sweep offload`, it tunes the user's job (--steps-cmd with
--ds-config) or a built-in model named on purpose (--model); never a
built-in model with the user's config."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...model.aio import AioSettings
from ...model.checkpoint import LAUNCHER_VARS
from ...model.checkpoint_sweep import CheckpointOutcome, CheckpointRequest
from ...model.sweep import TRIAL_TIMEOUT_S
from ...workloads.presets import get_preset
from .sweep import run_checkpoint_sweep
from .trial import candidate_changes
from ..journal import NAME as JOURNAL_NAME
from ..target import default_out, drive_of, sweep_target
from ..space import RunSettings
from ..user_job import parse_user_job, refuse_other_models

DEFAULT_MODEL = "tiny"


@dataclass(frozen=True)
class CheckpointArgs:
    """`iotune sweep checkpoint`'s options, parsed."""

    target_dir: Path | None = None
    bed: str | None = None
    model: str | None = None                     # a built-in preset, named on purpose
    ds_config: Path | None = None
    steps_cmd: str | None = None
    checkpoint_dirs: tuple[Path, ...] = ()       # where save_checkpoint may write (default: --path)
    save_at: int = 2
    steps: int | None = None                     # steps timed after the save
    restore_steps: int = 3                       # the 1st checks the weights, the later the optimizer state
    every: int = 10                              # the job's checkpoint interval, in optimizer steps
    dirty_limits: tuple[int, ...] = ()
    block_sizes: tuple[int, ...] = ()            # aio blocks to try with the fast writer
    repeats: int = 1
    steps_timeout_s: float | None = None
    out: Path | None = None
    fresh: bool = False


def request_for(args: CheckpointArgs, swap_dir: Path, cgroup: str | None, out: Path) -> CheckpointRequest:
    """The library's request: the user's job, or the built-in model named."""
    user: tuple[str, ...] = ()
    if args.steps_cmd:
        job = parse_user_job(args.steps_cmd, args.ds_config, args.steps or 2, args.steps_timeout_s or TRIAL_TIMEOUT_S,
                             need_nvme=False)
        user = job.argv
    else:
        get_preset(args.model or DEFAULT_MODEL)              # an unknown preset is refused before anything runs
    steps = args.steps or max(2, args.restore_steps)
    return CheckpointRequest(
        swap_dir=str(swap_dir), out_dir=str(out), targets=tuple(str(d) for d in args.checkpoint_dirs),
        preset=args.model or DEFAULT_MODEL, steps_cmd=user, ds_config=str(args.ds_config or ""),
        save_at=args.save_at, measure_steps=steps, interval_steps=args.every, restore_steps=args.restore_steps,
        repeats=args.repeats, dirty_limits=args.dirty_limits,
        aio_candidates=tuple(AioSettings(block_size=b) for b in args.block_sizes),
        timeout_s=args.steps_timeout_s or TRIAL_TIMEOUT_S, cgroup=cgroup or "",
        launcher_vars=all(v in os.environ for v in LAUNCHER_VARS))


def run_checkpoint_command(args: CheckpointArgs, say: Callable[[str], None]) -> CheckpointOutcome:
    refuse_other_models(args.ds_config, args.steps_cmd, args.model)
    drive = drive_of(args)
    job = {"cmd": args.steps_cmd, "config": str(args.ds_config or ""), "model": args.model}
    with sweep_target(args, RunSettings(), say) as (target, _):
        out = args.out or default_out("checkpoint", drive, job=job)
        request = request_for(args, target.files_dir, target.cgroup, out)
        say(f"checkpoint sweep: journal {out / JOURNAL_NAME}")
        return run_checkpoint_sweep(request, say, fresh=args.fresh, drive=drive)


def checkpoint_changes(outcome: CheckpointOutcome) -> dict[str, Any]:
    """What --apply writes: the pick's decisions as dotted keys, its
    `checkpoint.writer` block (torch.save: a writer in your config removed)
    and its aio keys when it has an aio block of its own; none when nothing
    restored. The directory and the writeback limit are not config keys:
    the report says them."""
    return candidate_changes(outcome.best.candidate) if outcome.best is not None else {}

