"""`iotune trace`, `iotune report` and `iotune compare`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import IotuneError, NoSpaceError, UsageError
from ..model.fleet import FleetRun, is_fleet_dir, load_fleet
from ..model.run import TraceRun
from ..model.runfile import (check_can_save, default_run_dir, give_to_sudo_user, load_run, save_or_spare,
                              save_record, save_run_or_spare)
from .fleet import fleet_nodes, trace_fleet_cli
from .options import (MultiNodeOptions, ReportOutput, chosen_format, emit, format_option, given, html_option,
                      library_errors, multinode_group, refuse_remote_iotune, refuse_width_with_json, report_output,
                      say, write_html)
from .trace_options import RunOptions, SaveOptions, TargetOptions, run_options, save_options, target_options
from .verdict_inputs import VerdictOptions, gather_inputs, trace_report, verdict_group

if TYPE_CHECKING:
    from ..remote.ssh import Transport


def progress_printer() -> Callable[[float, int, int, int, int], None] | None:
    if not sys.stderr.isatty():
        return None
    from ..model.units import seconds, volume

    def show(elapsed: float, rb: int, wb: int, rr: int, wr: int) -> None:
        sys.stderr.write(f"\r\x1b[2Ktracing · {seconds(elapsed)} · read {volume(rb)} ({rr:,} req) · "
                         f"written {volume(wb)} ({wr:,} req)")
        sys.stderr.flush()

    return show


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@target_options
@run_options
@multinode_group("trace", "an agent on each traces the devices holding --path there; the command runs here")
@save_options
@report_output
@verdict_group
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@library_errors
def trace(targets: TargetOptions, how: RunOptions, nodes: MultiNodeOptions, save: SaveOptions, output: ReportOutput,
          verdict: VerdictOptions, command: tuple[str, ...]) -> None:
    """Trace block I/O of COMMAND (or of a time window) with eBPF.

    Every request on the chosen devices is counted in the kernel: exact sizes,
    latency, in-flight depth, sequential share, and a timeline. The command's
    exit status becomes iotune's; Ctrl-C stops it and still saves the run.

    Python commands (DeepSpeed jobs, its launcher's ranks) also get a startup
    hook that records training phases (forward, backward, optimizer step,
    checkpoint) and DeepSpeed's swap I/O per tensor file, without changing
    the script: the report then breaks step time and I/O down by phase and by
    what the I/O serves (optimizer state, parameters, gradients).

    \b
    Examples:
      sudo iotune trace -- deepspeed train.py --deepspeed ds_config.json
      sudo iotune trace --path /mnt/nvme/swap -- python train.py
      sudo iotune trace -d loop0 -- fio --name=w --filename=/dev/loop0 --rw=write --bs=512k --size=64m --direct=1
      sudo iotune trace --duration 30 --json > window.json
      sudo iotune trace --hostfile hosts --path /mnt/nvme -- deepspeed --hostfile hosts train.py ...
      iotune trace --slurm --path /mnt/nvme -- srun python train.py ...   (in an sbatch script)

    Multi-node (--hosts, --hostfile, or a `deepspeed --hostfile` command
    naming several hosts): an agent on every host traces the devices holding
    --path there, over ssh (iotune must be installed at the same path on
    every host, or give --remote-iotune); the command runs here, and the
    hosts' runs are saved together as one multi-node run. Inside a Slurm
    allocation, --slurm traces every node of the job through srun instead
    of ssh.

    DeepSpeed op-build locks (left in the torch extensions cache by a
    killed build, they make every load of the op wait forever): a Python
    command is refused (exit 2) when one older than 10 minutes has no
    process holding or building it, naming the file to remove; while the
    command runs, a lock nobody holds or builds is named on stderr within
    seconds (until the first training step; without the hook, after 10 s),
    and the command goes on when you remove it.
    """
    refuse_width_with_json(output.format)
    argv = command_argv(command, how.duration)
    refuse_inert(bool(argv), save, how)
    found = fleet_nodes(nodes.hosts, nodes.hostfile, nodes.slurm, argv)
    if not save.no_save:
        check_can_save(save.out or RUNS_ROOT)     # before the command runs: no wasted run
    if found and targets.app_layer:
        raise UsageError("--app traces one machine: drop it for a multi-node trace")
    if found:
        return trace_hosts(found, targets, how, save, output, verdict, nodes.remote_iotune, argv)
    refuse_remote_iotune(nodes.remote_iotune, False, "trace")
    trace_here(argv, targets, how, save, output, verdict)


def command_argv(command: tuple[str, ...], duration: float | None) -> list[str]:
    """The command to trace (a leading `--` dropped); [] for a --duration window."""
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and duration is not None:
        raise UsageError("give either a command or --duration, not both")
    if not argv and duration is None:
        raise UsageError("nothing to trace: give a command after `--` (iotune trace -- CMD ARGS...) "
                         "or a window with --duration S")
    return argv


def trace_here(argv: list[str], targets: TargetOptions, how: RunOptions, save: SaveOptions, output: ReportOutput,
               verdict: VerdictOptions) -> None:
    """The single-node trace: run it, save it, show its report."""
    from ..trace.child import sudo_user
    from ..trace.selection import choose_targets
    from ..trace.session import TraceOptions, trace_command, trace_window

    inject = bool(argv) and not how.no_inject
    chosen = choose_targets(targets.devices, targets.paths, targets.with_lower, targets.app_layer, say)
    opts = TraceOptions(devices=chosen.devices, interval_s=how.interval or (0.01 if inject else 1.0),
                        linger_s=how.linger, run_as=None if how.as_root else sudo_user(),
                        stdout_to_stderr=output.format != "console", inject=inject, app=chosen.app,
                        block=chosen.block)
    progress = progress_printer()
    if argv:
        run = trace_command(argv, opts, progress, notice(progress))
    else:
        run = trace_window(how.duration or 0, opts, progress)
    if progress:
        sys.stderr.write("\r\x1b[2K")
    where = save.out or default_run_dir(argv[0] if argv else "window")
    unsaved = None if save.no_save else save_and_say(run, where)
    inputs, measured = gather_inputs(run, verdict, say)
    if measured is not None:
        run = replace(run, job_ceiling=measured)
        if not save.no_save and unsaved is None:
            keep_job_ceiling(run, where)
    judged = trace_report(run, inputs)
    emit(judged, output.format, output.width, output.block_size)
    write_html(judged, output.html_path)
    end_with([unsaved] if unsaved else [], run.exit_status)    # after the report: it may be all that is left


def refuse_inert(command: bool, save: SaveOptions, how: RunOptions) -> None:
    """Options that would do nothing in this combination are refused, each with its fix."""
    if save.no_save and save.out is not None:
        raise UsageError("-o/--out says where to save the run, and --no-save not to save it: drop one of them")
    if not command:
        for flag, set_ in (("--linger", given("linger")), ("--no-inject", how.no_inject), ("--as-root", how.as_root)):
            if set_:
                raise UsageError(f"{flag} is about the traced command, and --duration traces a time window "
                                 f"with none: drop {flag}, or give a command after `--`")


def notice(progress: Callable[[float, int, int, int, int], None] | None) -> Callable[[str], None]:
    """A status line during the trace, on its own line when the progress line is shown."""
    def tell(message: str) -> None:
        if progress:
            sys.stderr.write("\r\x1b[2K")
        say(message)

    return tell


def trace_hosts(found: tuple[tuple[str, ...], Transport], targets: TargetOptions, how: RunOptions,
                save: SaveOptions, output: ReportOutput, verdict: VerdictOptions, remote_iotune: str | None,
                argv: list[str]) -> None:
    """The multi-node trace: run it, save the fleet, show its report."""
    from ..model.fleet import save_fleet
    from ..trace.lockwatch import check_before_start

    if save.no_save:
        raise UsageError("a multi-node trace is always saved (its report reads the saved nodes): drop --no-save")
    warning = check_before_start(argv, dict(os.environ))       # this machine's cache: the launcher runs here
    if warning:
        say(warning)
    fleet, status = trace_fleet_cli(found, targets, how, remote_iotune, output.format != "console", argv)
    asked = save.out or default_run_dir(argv[0])
    try:
        where, elsewhere = save_or_spare(lambda d: save_fleet(fleet, d), asked, spare_root())
    except NoSpaceError:
        show_fleet(fleet, output, verdict)    # all that is left of it
        raise
    give_to_sudo_user(where)
    if not elsewhere:
        say(f"saved {where}  (iotune report {where})")
    report_fleet(where, output, replace(verdict, probe_ceiling=False))
    end_with([p for p in (elsewhere, partial_failure(fleet, where)) if p], status)


def partial_failure(fleet: FleetRun, where: Path) -> str:
    """The error of a multi-node run with nodes lost or failed ("" if none)."""
    partial = [n for n in fleet.nodes if n.status != "ok"]
    if not partial:
        return ""
    nodes = ", ".join(f"{n.host} {n.status}" for n in partial)
    return (f"{len(partial)} of {len(fleet.nodes)} node(s) not traced to the end ({nodes}: see the report); the "
            f"other nodes' runs are kept in {where}")


def end_with(problems: list[str], status: int | None) -> None:
    """Exit after the report: each problem said on stderr, the last as the
    error. The command's own failure keeps its exit status; otherwise a
    problem (the run saved elsewhere, a node lost) makes it 1."""
    for problem in problems[:-1]:
        say(f"Error: {problem}")
    if problems and not status:
        raise IotuneError(problems[-1])
    if problems:
        say(f"Error: {problems[-1]}")
    if status:
        sys.exit(status)


RUNS_ROOT = Path("iotune-runs")


def spare_root() -> Path:
    """Where a run goes when --out's drive is full: the temporary directory
    ($TMPDIR, else /tmp), under iotune-runs/. $TMPDIR is taken as it is
    (tempfile.gettempdir() would silently pass over a full one)."""
    import tempfile

    tmpdir = os.environ.get("TMPDIR", "")
    return (Path(tmpdir) if tmpdir and Path(tmpdir).is_dir() else Path(tempfile.gettempdir())) / "iotune-runs"


def save_and_say(run: TraceRun, where: Path) -> str | None:
    """Save the run at `where` (or, when that fails, under spare_root());
    None when it is where it was asked to be, else the error to end with."""
    try:
        saved, elsewhere = save_run_or_spare(run, where, spare_root())
    except NoSpaceError as e:
        return str(e)
    give_to_sudo_user(saved)
    if elsewhere:
        return elsewhere
    say(f"saved {where}  (iotune report {where})")
    return None


@click.command()
@click.argument("run_path", metavar="RUN", type=click.Path(path_type=Path))
@report_output
@verdict_group
@library_errors
def report(run_path: Path, output: ReportOutput, verdict: VerdictOptions) -> None:
    """Show a saved run again (RUN is its directory or run.json), with the
    verdict judged by today's rules. A multi-node run's directory (with
    fleet.json) gets the fleet report: per node, per rank, the slowest node
    of each step."""
    refuse_width_with_json(output.format)
    if is_fleet_dir(run_path):
        return report_fleet(run_path, output, verdict)
    run = load_run(run_path)
    inputs, measured = gather_inputs(run, verdict, say)
    if measured is not None:
        run = replace(run, job_ceiling=measured)
        keep_job_ceiling(run, run_path)
    judged = trace_report(run, inputs)
    emit(judged, output.format, output.width, output.block_size)
    write_html(judged, output.html_path)


def keep_job_ceiling(run: TraceRun, where: Path) -> None:
    """Save the job-pattern ceiling just measured in the run's run.json, so a
    later `iotune report` shows it again; a warning when it cannot be."""
    try:
        saved = save_record(run, where)
    except (OSError, NoSpaceError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        say(f"warning: the job-pattern ceiling was not saved with the run ({why}): `iotune report {where}` "
            f"will not show it without --ceiling")
        return
    say(f"saved the job-pattern ceiling in {saved}")


def report_fleet(path: Path, output: ReportOutput, verdict: VerdictOptions) -> None:
    if verdict.probe_ceiling:
        raise UsageError("--ceiling probes this machine's devices, not a fleet's nodes: run `iotune report "
                         f"{path}/nodes/HOST --ceiling` on that node")
    show_fleet(load_fleet(path), output, verdict)


def show_fleet(fleet: FleetRun, output: ReportOutput, verdict: VerdictOptions) -> None:
    from ..analysis.fleet import fleet_report
    from ..model.verdict import VerdictInputs

    tbw, capacity = verdict.drive_tbw, verdict.drive_capacity
    inputs = VerdictInputs(drive_tbw_bytes=float(tbw) if tbw else None, tbw_source="--drive-tbw" if tbw else "",
                           drive_capacity_bytes=float(capacity) if capacity else None)
    judged = fleet_report(fleet, inputs)
    emit(judged, output.format, output.width)
    write_html(judged, output.html_path)


@click.command()
@click.argument("run_paths", metavar="RUN...", nargs=-1, required=True, type=click.Path(path_type=Path))
@format_option
@html_option
@library_errors
def compare(run_paths: tuple[Path, ...], fmt: str, as_json: bool, html_path: Path | None = None) -> None:
    """Compare saved runs side by side: step time, optimizer step, GB moved
    per step, dominant request size, bandwidth. The first run is the
    reference for the ratio column.

    \b
    Example:
      iotune compare iotune-runs/*-nvme-opt iotune-runs/*-zenflow iotune-runs/*-cpu
    """
    from ..analysis.compare import compare_runs

    comparison = compare_runs([(load_run(p), p.name) for p in run_paths])
    emit(comparison, chosen_format(fmt, as_json))
    write_html(comparison, html_path)
