"""`iotune sweep checkpoint`: how the user's job saves and loads its
checkpoints, each restore checked."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ...model.units import parse_size
from ..options import (F, SettingType, csv_list, emit, library_errors, option_group, resumable, say, setting_help,
                       setting_list)
from .apply import apply_decision
from ..groups import FormatOutput, sections
from .groups import (ApplyOptions, DriveOptions, JobOptions, JournalOptions, SweepCommand, apply_options, drive_options,
                     job_options, journal_options, output_options)


@dataclass(frozen=True)
class CheckpointOptions:
    """Where checkpoints may go, when the trial saves and what it checks."""

    checkpoint_dirs: tuple[Path, ...]
    save_at: int
    restore_steps: int
    checkpoint_every: int
    dirty_limits: tuple[int, ...] | None
    block_sizes: tuple[int, ...] | None
    repeats: int | None


def checkpoint_options(fn: F) -> F:
    return option_group(
        CheckpointOptions, "checkpoint",
        click.option("--checkpoint-dir", "checkpoint_dirs", multiple=True, metavar="DIR",
                     type=click.Path(file_okay=False, path_type=Path),
                     help="A directory save_checkpoint may write to, tried besides --path (repeat per "
                          "directory, e.g. another drive)."),
        click.option("--save-at", type=click.IntRange(min=1), default=2, show_default=True, metavar="STEP",
                     help="Save after this optimizer step (the ones before set the pace)."),
        click.option("--restore-steps", type=click.IntRange(min=1), default=3, show_default=True, metavar="N",
                     help="Steps compared after the restore with the uninterrupted run: the first step's loss "
                          "checks the weights (exactly), the later steps' the optimizer state (within 1e-5 "
                          "relative: a restarted Adam differs from the second step on). A checkpoint that loses the "
                          "optimizer state is not recommended, unless every candidate does (DeepSpeed 0.19.8 with "
                          "the optimizer on NVMe); 1 checks the weights only."),
        click.option("--checkpoint-every", type=click.IntRange(min=1), default=10, show_default=True,
                     metavar="STEPS",
                     help="Your job's checkpoint interval in optimizer steps, over which a checkpoint's cost is "
                          "counted."),
        click.option("--dirty-limits", callback=csv_list(parse_size), default=None, metavar="LIST",
                     help="Page-cache writeback limits to try on the checkpoint's drive (its /sys/class/bdi "
                          "max_bytes, strict; put back after each trial), e.g. 32MiB,256MiB. Default: not "
                          "varied."),
        click.option("--block-sizes", callback=setting_list("block_size"), default=None, metavar="LIST",
                     help=setting_help("block_size", "aio block sizes to try when the fast writer wins (it "
                                                     "shares the aio block with swapping), e.g. 256K,1M.")),
        click.option("--repeats", type=SettingType("repeats"), default=None, metavar="N",
                     help=setting_help("repeats", "Trials of each candidate.")),
    )(fn)


MODEL_HELP = ("Instead of --steps-cmd: sweep a built-in model on purpose (tiny, small, medium, wide, 1b). "
              "Default without --steps-cmd and --ds-config: tiny.")
CHECKPOINT_SECTIONS = sections(("Drive", DriveOptions), ("Your job (or a built-in model)", JobOptions),
                               ("Checkpoints", CheckpointOptions), ("Journal", JournalOptions),
                               ("Apply", ApplyOptions), ("Output", FormatOutput))


@click.command("checkpoint", cls=SweepCommand, groups=CHECKPOINT_SECTIONS)
@drive_options
@job_options(MODEL_HELP)
@checkpoint_options
@journal_options("Journal directory (default: one per drive and job under iotune-sweeps/). An existing journal "
                 "is resumed.")
@apply_options("the checkpoint writer and aio block the sweep chose")
@output_options
@library_errors
def checkpoint(drive: DriveOptions, job: JobOptions, checkpoint: CheckpointOptions, journal: JournalOptions,
               apply: ApplyOptions, output: FormatOutput) -> None:
    """Tune how your job saves and loads its checkpoints: DeepSpeed's
    defaults, then the checkpoint writer (torch.save, the fast writer's
    buffers, the decoupled writer), each --checkpoint-dir, a writeback limit
    on the target drive (--dirty-limits) and, when the fast writer wins, the
    aio blocks of --block-sizes.

    Each trial saves in a real run and loads in a fresh process whose next
    steps' losses are compared with the uninterrupted run's: the first
    step's for the weights, the later ones' for the optimizer state (Adam).
    A checkpoint that does not restore its weights is never recommended, one
    that loses the optimizer state only when every candidate does, and the
    report then says so. Candidates DeepSpeed would refuse under your job's
    launcher are refused before running. Candidates are ranked by what the
    checkpoint adds to its interval (--checkpoint-every).

    \b
    Examples:
      sudo iotune sweep checkpoint --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --checkpoint-every 100
      sudo iotune sweep checkpoint --path /mnt/nvme/swap --checkpoint-dir /mnt/nvme2/ckpt --model tiny
    """
    from ...sweep.checkpoint.command import CheckpointArgs, checkpoint_changes, run_checkpoint_command

    drive.refuse_both()
    apply.refuse_inert()
    apply.refuse_without_job(job)
    args = CheckpointArgs(target_dir=drive.target_dir, bed=drive.bed, model=job.model, ds_config=job.ds_config,
                          steps_cmd=job.steps_cmd, checkpoint_dirs=checkpoint.checkpoint_dirs, save_at=checkpoint.save_at,
                          steps=job.steps, restore_steps=checkpoint.restore_steps, every=checkpoint.checkpoint_every,
                          dirty_limits=checkpoint.dirty_limits or (), block_sizes=checkpoint.block_sizes or (),
                          repeats=checkpoint.repeats or 1, steps_timeout_s=job.steps_timeout_s, out=journal.out,
                          fresh=journal.fresh)
    with resumable():
        outcome = run_checkpoint_command(args, say)
    apply_decision(apply, checkpoint_changes(outcome))
    emit(outcome, output.format)
    if outcome.best is None:
        sys.exit(1)
