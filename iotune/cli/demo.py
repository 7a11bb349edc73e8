"""`iotune demo`: the main job on built-in defaults."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click

from ..errors import IotuneError, JobFailed, UsageError
from ..model.runfile import check_can_save, default_run_dir, give_to_sudo_user
from ..volumes.beds import BEDS
from .options import (chosen_format, drive_cap_option, emit, format_option, given, library_errors, out_option,
                      refuse_width_with_json, report_options, say, write_html)
from .trace import RUNS_ROOT, save_and_say


@click.command()
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the scratch drive's image goes (default: a temporary directory).")
@drive_cap_option()
@out_option("Save the run here (default: ./iotune-runs/<time>-demo).")
@click.option("--workload", type=click.Choice(["train", "fio"]), default="train", show_default=True,
              help="train: the built-in DeepSpeed workload (ZeRO-3, optimizer on the drive); fio: a "
                   "swap-like fio job (no DeepSpeed needed).")
@click.option("--steps", type=click.IntRange(2, 1000), default=8, show_default=True,
              help="With --workload train: training steps to run.")
@click.option("--bed", type=click.Choice(list(BEDS)), default=None, metavar="NAME",
              help="Run on a test bed instead of the scratch drive (not with --drive-cap: a bed has its own "
                   "limits): "
                   + ", ".join(BEDS) + ". See `iotune volumes bed --help`.")
@format_option
@report_options
@library_errors
def demo(workdir: Path | None, drive_cap: float, out: Path | None, workload: str, steps: int, fmt: str, as_json: bool,
         block_size: int | None, width: int | None, bed: str | None = None) -> None:
    """Trace the built-in offload workload on a capped scratch drive.

    Creates a loop drive over a file (direct I/O, ext4, bandwidth-capped with
    cgroup blkio: an NVMe stand-in with a known limit), trains the built-in
    tiny Llama with ZeRO-3 and the optimizer state swapped to that drive
    through DeepSpeed's aio (512 KiB blocks), traces it with phase and swap
    attribution, and prints the report with its verdict; the run and an HTML
    report (report.html, open it in any browser, offline) are saved together.
    Everything else it creates is removed afterwards, also on Ctrl-C.

    The job's own output (DeepSpeed's messages, its step records) goes to
    job.log in the run's directory; stderr shows the steps as they finish (a
    live bar on a terminal, else one line per step). When the job fails, the
    last 40 lines of job.log are shown and the exit status is 1.
    """
    from ..demo import JOB_LOG, run_demo
    from ..render.progress import step_progress

    from ..model.verdict import DeviceCeiling, VerdictInputs
    from .verdict_inputs import trace_report

    refuse_width_with_json(chosen_format(fmt, as_json))
    if bed is not None and given("drive_cap"):
        raise UsageError(f"--bed {bed} runs on the bed's own drives and limits, not on a capped scratch drive: "
                         f"drop --drive-cap, or drop --bed")
    if workload == "fio" and given("steps"):
        raise UsageError("--steps counts training steps; --workload fio runs a fixed fio job: drop --steps, "
                         "or use --workload train")
    cap = drive_cap
    check_can_save(out or RUNS_ROOT, or_else="")     # before the training run, not after it
    where = out or default_run_dir("demo")
    log = where / JOB_LOG
    with step_progress("training") as on_step:
        run = run_demo(workdir, int(cap), say, workload, steps, bed=bed, log=log, on_step=on_step)
    unsaved = save_and_say(run, where)   # the message when the run went elsewhere (docs/faults.md)
    # the scratch drive's ceiling is its cap, known exactly (a test bed's is not passed on here)
    known = tuple(DeviceCeiling(d.name, cap, "the scratch drive's blkio cap (--drive-cap), each direction", cap, cap,
                                cap=True) for d in run.devices if not d.is_lower) if cap and bed is None else ()
    judged = trace_report(run, VerdictInputs(ceilings=known))
    if unsaved is None:
        write_html(judged, where / "report.html")
        give_to_sudo_user(where)
    emit(judged, chosen_format(fmt, as_json), width, block_size or 512 * 1024)
    if run.outcome == "failed":
        fail_with_log(run.exit_status, workload, log, unsaved)
    if unsaved is not None:
        raise IotuneError(unsaved)


def fail_with_log(status: int | None, workload: str, log: Path, unsaved: str | None) -> NoReturn:
    """After the report of a failed job: the last lines of its log, then the error."""
    from ..host.proc import tail_lines
    from ..render.progress import TAIL_LINES, log_tail

    lines = tail_lines(log, TAIL_LINES)
    if lines:
        say(log_tail(lines, str(log)))
    if unsaved is not None:
        say(f"Error: {unsaved}")
    job = "training run" if workload == "train" else "fio job"
    raise JobFailed(f"the demo's {job} failed (exit {status})"
                    + (f": the last lines of its log {log} are above" if lines else f", and its log {log} is empty")
                    + "; `iotune doctor` checks what the demo needs")
