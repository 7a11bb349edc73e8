"""`iotune sweep aio` (bare `iotune sweep` too): DeepSpeed's aio block for
one drive, or for every node."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from ..fleet import fleet_nodes, refuse_with_hosts, sweep_hosts
from ..options import (DURATION, F, MultiNodeOptions, SettingType, emit, html_option, library_errors, multinode_group,
                       option_group, refuse_remote_iotune, renamed_option, resumable, say, setting_help, setting_list,
                       write_html)
from ..groups import FormatOutput, sections
from .groups import (ApplyOptions, DriveOptions, JobOptions, JournalOptions, SweepCommand, apply_options, drive_options,
                     job_options, journal_options, output_options)


@dataclass(frozen=True)
class SearchOptions:
    """The aio search: the profile, the executor and the values searched."""

    profile: str
    executor: str
    block_sizes: tuple[int, ...] | None
    queue_depths: tuple[int, ...] | None
    aio_threads: tuple[int, ...] | None
    single_submit: tuple[bool, ...] | None
    overlap_events: tuple[bool, ...] | None
    engines: tuple[str, ...] | None
    grid: bool
    repeats: int | None
    file_bytes: int | None


@dataclass(frozen=True)
class ConfirmOptions:
    """--confirm and --omp-threads: what runs on training steps."""

    confirm_top: int | None
    omp_threads: tuple[int, ...] | None
    replay_pairs: int | None = None
    budget_s: float | None = None


@dataclass(frozen=True)
class ExportOptions:
    """--export, --export-jobs and --html: the trials and the report, as files."""

    export_to: Path | None
    export_jobs: Path | None
    html_path: Path | None


def search_options(fn: F) -> F:
    return option_group(
        SearchOptions, "search",
        click.option("--profile", default="default", show_default=True,
                     help="Search space and run settings: a name from profiles/ (default, quick, "
                          "ds-nvme-tune-grid) or a TOML file."),
        click.option("--executor", type=click.Choice(["fio", "aio"]), default="fio", show_default=True,
                     help="Measure with fio, or with DeepSpeed's own aio engine (aio_handle)."),
        click.option("--block-sizes", callback=setting_list("block_size"), default=None, metavar="LIST",
                     help=setting_help("block_size", "Override the profile's aio block_size values, e.g. "
                                                     "256K,1M,4M.")),
        click.option("--queue-depths", callback=setting_list("queue_depth"), default=None, metavar="LIST",
                     help=setting_help("queue_depth", "Override the profile's aio queue_depth values, e.g. "
                                                      "4,8,32.")),
        click.option("--aio-threads", callback=setting_list("intra_op_parallelism"), default=None, metavar="LIST",
                     help=setting_help("intra_op_parallelism", "Override the profile's aio intra_op_parallelism "
                                                               "values (fio: numjobs), e.g. 1,2,4.")),
        click.option("--single-submit", callback=setting_list("single_submit"), default=None, metavar="LIST",
                     help=setting_help("single_submit", "Override the profile's aio single_submit values, e.g. "
                                                        "false or false,true.")),
        click.option("--overlap-events", callback=setting_list("overlap_events"), default=None, metavar="LIST",
                     help=setting_help("overlap_events", "Override the profile's aio overlap_events values, "
                                                         "e.g. true.")),
        click.option("--engines", callback=setting_list("engine"), default=None, metavar="LIST",
                     help=setting_help("engine", "fio's ioengines to compare, e.g. libaio,io_uring.")),
        click.option("--grid", is_flag=True, help="Measure every combination instead of the adaptive search."),
        click.option("--repeats", type=SettingType("repeats"), default=None, metavar="N",
                     help=setting_help("repeats", "Repeats of the finalists (of every point with --grid).")),
        click.option("--file-bytes", type=SettingType("file_bytes"), default=None, metavar="SIZE",
                     help=setting_help("file_bytes", "Bytes per tensor file per trial, e.g. 32M.")),
    )(fn)


def confirm_options(fn: F) -> F:
    return option_group(
        ConfirmOptions, "confirm",
        click.option("--confirm", "confirm_top", type=SettingType("confirm_top"), default=None, metavar="N",
                     help=setting_help("confirm_top", "Candidates that run real training steps in alternating "
                                       "pairs with DeepSpeed's defaults; the steps decide (0: none, the "
                                       "executor's best is recommended).")),
        click.option("--omp-threads", callback=setting_list("omp_threads"), default=None, metavar="LIST",
                     help=setting_help("omp_threads",
                                       "CPU-optimizer threads (OMP_NUM_THREADS) to compare on training steps, "
                                       "e.g. 1,2: the recommendation's optimizer-step time at each count, as a "
                                       "table, and the count to use (0: the job's own default, OMP_NUM_THREADS "
                                       "unset). Counts above the machine's cores only oversubscribe them. Needs "
                                       "--confirm 1 or more.")),
        click.option("--replay-pairs", "replay_pairs", type=SettingType("replay_pairs"), default=None, metavar="N",
                     help=setting_help("replay_pairs", "Rank the candidates first on the replay of your job's own "
                                       "swap I/O, recorded from one run at DeepSpeed's defaults: at most N "
                                       "alternating pairs each with the defaults; only the replay's pick then "
                                       "runs real steps. 0: no replay, every candidate runs real steps (as when "
                                       "the replay does not reproduce the traced step within 5 %).")),
        click.option("--budget", "budget_s", type=DURATION, default=None, metavar="DURATION",
                     help="The most this sweep may take, e.g. 45m, 2h or 1h30m (s, m, h), the aio search on the "
                          "drive included. Once the first training-step trial is timed it prints its plan fitted "
                          "to what is left (fewer replays, pairs or thread trials when it must) and, when the "
                          "budget stops it, what it could not decide. Default: 24 trials of your job, timed on "
                          "that first trial, at most an hour (at least that trial and 3 pairs)."),
    )(fn)


def export_options(fn: F) -> F:
    return option_group(
        ExportOptions, "export",
        click.option("--export", "export_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     metavar="FILE", help="All trials as a table: .csv or .parquet."),
        click.option("--export-jobs", type=click.Path(file_okay=False, path_type=Path), default=None,
                     metavar="DIR", help="Write the fio job file of every ranked point into DIR."),
        html_option,
    )(fn)


MODEL_HELP = ("Confirm on this built-in model instead of your job, named on purpose (tiny, small, medium, wide, "
              "1b); without --steps-cmd the confirmation runs tiny. --apply needs --steps-cmd or --model.")
AIO_SECTIONS = sections(("Drive", DriveOptions), ("aio search", SearchOptions),
                        ("Training steps (your job, or a built-in model)", ConfirmOptions),
                        ("Training steps (your job, or a built-in model)", JobOptions),
                        ("Multi-node", MultiNodeOptions), ("Journal", JournalOptions),
                        ("Apply", ApplyOptions), ("Output", ExportOptions), ("Output", FormatOutput))


@click.command("aio", cls=SweepCommand, groups=AIO_SECTIONS)
@drive_options
@renamed_option("--threads", "--aio-threads", "aio_threads", callback=setting_list("intra_op_parallelism"),
                metavar="LIST")
@search_options
@confirm_options
@job_options(MODEL_HELP)
@multinode_group("sweep", "the same sweep on each, of --path on each host's own drive, compared: slow nodes, and "
                          "whether they deserve different settings")
@journal_options("Journal directory (default iotune-sweeps/<profile>-<executor>-<drive id>, one per drive). "
                 "An existing journal is resumed.")
@apply_options("the aio block the sweep chose")
@export_options
@output_options
@library_errors
def aio(drive: DriveOptions, search: SearchOptions, confirm: ConfirmOptions, job: JobOptions,
        nodes: MultiNodeOptions, journal: JournalOptions, apply: ApplyOptions, export: ExportOptions,
        output: FormatOutput) -> None:
    """Tune DeepSpeed's aio block (block size, queue depth, threads, submit
    modes) for a drive, and hand over a config DeepSpeed accepts as pasted.
    Bare `iotune sweep` runs this.

    Each point writes and reads back tensor-sized files with O_DIRECT, the
    way ZeRO-Infinity's swapper does. The default adaptive search measures
    block size, then queue depth, then threads and submit modes around the
    best, then repeats the finalists and DeepSpeed's defaults. The best
    candidates then run real training steps in alternating pairs with
    DeepSpeed's defaults, until a sequential rule decides; one is
    recommended only if its optimizer step is faster beyond the noise,
    otherwise the defaults are. Every trial is journaled as it ends: Ctrl-C
    and the same command again resumes where it stopped.

    \b
    Examples:
      sudo iotune sweep aio                              built-in emulated drive
      sudo iotune sweep aio --bed latency-bound          a test bed where the defaults lose
      sudo iotune sweep aio --path /mnt/nvme/swap --profile quick
      sudo iotune sweep aio --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --apply ds_config.json
      sudo iotune sweep aio --hostfile hosts --path /mnt/nvme/swap --profile quick
      iotune sweep aio --slurm --path /mnt/nvme/swap --profile quick   (in an sbatch script)

    Multi-node (--hosts or --hostfile): the sweep runs on every host at
    once over ssh (iotune at the same path there, or --remote-iotune); each
    node's outcome and the fleet's report are saved in -o (default
    iotune-sweeps/fleet-<profile>-<time>; the same -o resumes every node).
    The report flags nodes whose measured ceiling is more than their noise
    below the median, and says whether the nodes deserve different settings.
    """
    from ...render.progress import sweep_progress
    from ...sweep.aio.command import run_sweep_command

    drive.refuse_both()
    apply.refuse_inert()
    fleet = fleet_nodes(nodes.hosts, nodes.hostfile, nodes.slurm, [], command="sweep")
    refuse_remote_iotune(nodes.remote_iotune, bool(fleet), "sweep")
    if fleet:
        refuse_with_hosts(bed=drive.bed, apply=apply.apply_to,
                          export=export.export_to, export_jobs=export.export_jobs, html=export.html_path)
    apply.refuse_without_job(job)
    if export.export_to is not None:
        from ...analysis.sweep_frames import check_export_path
        check_export_path(export.export_to)      # before the sweep, not after it
    args = sweep_args(drive, search, journal, job, confirm)
    if fleet:
        if sweep_hosts(*fleet, args, nodes.remote_iotune, output.format):
            sys.exit(1)
        return
    with resumable(), sweep_progress() as on_trial:
        outcome, target = run_sweep_command(args, say, on_trial)
    finish(outcome, target, apply, export, output)


def sweep_args(drive: DriveOptions, search: SearchOptions, journal: JournalOptions,
               job: JobOptions | None = None, confirm: ConfirmOptions | None = None) -> Any:
    """The library's SweepArgs from the option groups (without job and
    confirm: no training steps, as in layouts and netfs)."""
    from ...sweep.aio.command import SpaceOverrides, SweepArgs

    overrides = SpaceOverrides(block_size=search.block_sizes, queue_depth=search.queue_depths,
                               intra_op_parallelism=search.aio_threads, single_submit=search.single_submit,
                               overlap_events=search.overlap_events, engine=search.engines,
                               omp_threads=confirm.omp_threads if confirm else None)
    steps: dict[str, Any] = {} if job is None else dict(steps=job.steps, steps_timeout_s=job.steps_timeout_s,
                                        steps_cmd=job.steps_cmd, ds_config=job.ds_config, model=job.model)
    if confirm is not None:
        steps["confirm_top"] = confirm.confirm_top
        steps["replay_pairs"] = confirm.replay_pairs
        steps["budget_s"] = confirm.budget_s
    return SweepArgs(target_dir=drive.target_dir, profile=search.profile, executor=search.executor,
                     overrides=overrides, grid=search.grid, repeats=search.repeats, file_bytes=search.file_bytes,
                     out=journal.out, fresh=journal.fresh, bed=drive.bed, **steps)


def finish(outcome: Any, target: Any, apply: ApplyOptions, export: ExportOptions, output: FormatOutput) -> None:
    """Exports, --apply, the report and the exit status of one drive's aio sweep."""
    from .apply import apply_decision

    if export.export_to is not None:
        from ...analysis.sweep_frames import export_trials
        export_trials(Path(outcome.journal), export.export_to)
        say(f"trials exported to {export.export_to}")
    if export.export_jobs is not None:
        from ...sweep.fio_executor import export_jobfiles
        say(f"{export_jobfiles(outcome.ranking, target, export.export_jobs)} fio job files in {export.export_jobs}")
    if outcome.fragment:
        from ...sweep.aio.recommend import aio_changes

        written = apply_decision(apply, aio_changes(outcome))
        if written is not None:
            outcome = replace(outcome, applied_to=str(written))
    emit(outcome, output.format)
    write_html(outcome, export.html_path)
    if outcome.recommended is None or outcome.validation_error or outcome.confirm_error:
        sys.exit(1)

