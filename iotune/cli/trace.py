"""`iotune trace`, `iotune report` and `iotune compare`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import IotuneError, NoSpaceError, UsageError
if TYPE_CHECKING:
    from ..blockdev.devices import BlockDevice
    from ..trace.applayer import AppOptions
from ..model.fleet import FleetRun, is_fleet_dir, load_fleet
from ..model.run import TraceRun
from ..model.runfile import (check_can_save, default_run_dir, give_to_sudo_user, load_run, save_or_spare,
                              save_run_or_spare)
from .fleet import fleet_nodes, trace_fleet_cli
from .options import (chosen_format, emit, format_option, given, html_option, library_errors, multinode_options,
                      out_option, refuse_remote_iotune, refuse_width_with_json, report_options, say, write_html)
from .verdict_inputs import gather_inputs, trace_report, verdict_options

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
@click.option("-d", "--device", "devices", multiple=True, metavar="DEV",
              help="Trace only this block device: name (loop0), /dev path or MAJ:MIN. Repeatable.")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
              help="Trace the device(s) holding PATH, e.g. your nvme_path (btrfs: every member). Repeatable.")
@click.option("--app", "app_layer", is_flag=True,
              help="Also trace the application layer: every read and write the command's processes submit "
                   "(read/write/pread/pwrite, libaio, io_uring), per file, next to the block requests. "
                   "On by itself for a --path with no block device (FUSE, NFS).")
@click.option("--with-lower", is_flag=True,
              help="Also trace what the chosen devices sit on (a loop device's backing disk), "
                   "reported separately and never added to totals.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
              help="No command: trace for S seconds (Ctrl-C ends early).")
@click.option("--interval", type=click.FloatRange(0.001, 3600), default=None, metavar="S",
              help="Timeline resolution in seconds (default 1, or 0.01 when attributing I/O to "
                   "training phases).")
@click.option("--no-inject", is_flag=True,
              help="Do not inject the attribution hooks into Python commands (phases and "
                   "DeepSpeed swap I/O are then not reported).")
@click.option("--linger", type=click.FloatRange(0, 3600), default=0.0, metavar="S",
              help="Keep tracing S seconds after the command ends (to catch delayed writeback).")
@multinode_options("trace", "an agent on each traces the devices holding --path there; the command runs here")
@out_option("Save the run here (default: ./iotune-runs/<time>-<command>).")
@click.option("--no-save", is_flag=True, help="Do not save the run.")
@click.option("--as-root", is_flag=True,
              help="Under sudo, run the command as root (default: as the user who ran sudo).")
@format_option
@report_options
@html_option
@verdict_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@library_errors
def trace(devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool, duration: float | None,
          interval: float | None, no_inject: bool, linger: float, out: Path | None, no_save: bool, as_root: bool,
          fmt: str, as_json: bool, block_size: int | None, width: int | None, command: tuple[str, ...],
          html_path: Path | None = None, probe_ceiling: bool = False, drive_tbw: int | None = None,
          drive_capacity: int | None = None, hosts: str | None = None, hostfile: Path | None = None,
          remote_iotune: str | None = None, slurm: bool = False, app_layer: bool = False) -> None:
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
    from ..trace.child import sudo_user
    from ..trace.session import TraceOptions, trace_command, trace_window

    fmt = chosen_format(fmt, as_json)
    refuse_width_with_json(fmt)
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and duration is not None:
        raise UsageError("give either a command or --duration, not both")
    if not argv and duration is None:
        raise UsageError("nothing to trace: give a command after `--` (iotune trace -- CMD ARGS...) "
                         "or a window with --duration S")
    refuse_inert(bool(argv), out, no_save, linger, no_inject, as_root)
    nodes = fleet_nodes(hosts, hostfile, slurm, argv)
    if not no_save:
        check_can_save(out or RUNS_ROOT)     # before the command runs: no wasted run
    if nodes and app_layer:
        raise UsageError("--app traces one machine: drop it for a multi-node trace")
    if nodes:
        return trace_hosts(*nodes, devices, paths, with_lower, interval, no_inject, remote_iotune, as_root,
                           fmt, width, html_path, drive_tbw, drive_capacity, out, no_save, argv)
    refuse_remote_iotune(remote_iotune, False, "trace")
    inject = bool(argv) and not no_inject
    chosen, app = trace_targets(devices, paths, with_lower, app_layer)
    opts = TraceOptions(devices=chosen, interval_s=interval or (0.01 if inject else 1.0), linger_s=linger,
                        run_as=None if as_root else sudo_user(), stdout_to_stderr=fmt != "console", inject=inject,
                        app=app, block=bool(chosen) or app is None or not app.targets
                        or any(t.has_block_layer for t in app.targets))
    progress = progress_printer()
    run = trace_command(argv, opts, progress, notice(progress)) if argv else trace_window(duration or 0, opts, progress)
    if progress:
        sys.stderr.write("\r\x1b[2K")
    unsaved = None if no_save else save_and_say(run, out or default_run_dir(argv[0] if argv else "window"))
    inputs = gather_inputs(run, probe_ceiling, drive_tbw, drive_capacity, say)
    judged = trace_report(run, inputs)
    emit(judged, fmt, width, block_size)
    write_html(judged, html_path)
    end_with([unsaved] if unsaved else [], run.exit_status)    # after the report: it may be all that is left


def refuse_inert(command: bool, out: Path | None, no_save: bool, linger: float, no_inject: bool,
                 as_root: bool) -> None:
    """Options that would do nothing in this combination are refused, each with its fix."""
    if no_save and out is not None:
        raise UsageError("-o/--out says where to save the run, and --no-save not to save it: drop one of them")
    if not command:
        for flag, set_ in (("--linger", given("linger")), ("--no-inject", no_inject), ("--as-root", as_root)):
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


# kernel interfaces, not storage: a --path there is a mistake, not an application-layer trace
PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "tracefs", "debugfs",
                                "securityfs", "bpf", "pstore", "configfs", "mqueue", "hugetlbfs", "fusectl"})


def trace_targets(devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool,
                  app_layer: bool) -> tuple[tuple[BlockDevice, ...], AppOptions | None]:
    """The block devices to trace and, with --app or a --path that has no
    block device (FUSE, NFS), what the application probe keeps."""
    from ..blockdev.devices import choose_devices
    from ..blockdev.targets import path_target
    from ..trace.applayer import AppOptions

    targets = tuple(path_target(p) for p in paths)
    pseudo = next((t for t in targets if t.fstype in PSEUDO_FILESYSTEMS), None)
    if pseudo is not None:
        raise UsageError(f"'{pseudo.path}' is on {pseudo.fstype} ({pseudo.source}), a kernel pseudo-filesystem with "
                         f"no storage to trace: give a path on the drive or network filesystem that holds the "
                         f"job's files (its nvme_path)")
    no_block = [t for t in targets if not t.has_block_layer]
    block_paths = tuple(t.path for t in targets if t.has_block_layer)
    for t in no_block:
        say(f"{t.path} is on {t.describe()}, which has no block device: tracing the application layer there")
    chosen = tuple(choose_devices(devices, block_paths, with_lower)) if devices or block_paths else ()
    if not (app_layer or no_block):
        return chosen, None
    return chosen, AppOptions(targets=targets, devices=tuple(choose_devices(devices)))


def trace_hosts(hosts: tuple[str, ...], transport: Transport, devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool,
                interval: float | None, no_inject: bool, remote_iotune: str | None, as_root: bool, fmt: str,
                width: int | None, html_path: Path | None, drive_tbw: int | None, drive_capacity: int | None,
                out: Path | None, no_save: bool, argv: list[str]) -> None:
    """The multi-node trace: run it, save the fleet, show its report."""
    from ..model.fleet import save_fleet
    from ..trace.lockwatch import check_before_start

    if no_save:
        raise UsageError("a multi-node trace is always saved (its report reads the saved nodes): drop --no-save")
    warning = check_before_start(argv, dict(os.environ))       # this machine's cache: the launcher runs here
    if warning:
        say(warning)
    fleet, status = trace_fleet_cli(hosts, transport, devices, paths, with_lower, interval, no_inject, remote_iotune,
                                    as_root, fmt != "console", argv)
    asked = out or default_run_dir(argv[0])
    try:
        where, elsewhere = save_or_spare(lambda d: save_fleet(fleet, d), asked, spare_root())
    except NoSpaceError:
        show_fleet(fleet, fmt, width, html_path, drive_tbw, drive_capacity)    # all that is left of it
        raise
    give_to_sudo_user(where)
    if not elsewhere:
        say(f"saved {where}  (iotune report {where})")
    report_fleet(where, fmt, width, html_path, False, drive_tbw, drive_capacity)
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
    import os
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
@format_option
@report_options
@html_option
@verdict_options
@library_errors
def report(run_path: Path, fmt: str, as_json: bool, block_size: int | None, width: int | None,
           html_path: Path | None = None, probe_ceiling: bool = False, drive_tbw: int | None = None,
           drive_capacity: int | None = None) -> None:
    """Show a saved run again (RUN is its directory or run.json), with the
    verdict judged by today's rules. A multi-node run's directory (with
    fleet.json) gets the fleet report: per node, per rank, the slowest node
    of each step."""
    refuse_width_with_json(chosen_format(fmt, as_json))
    if is_fleet_dir(run_path):
        return report_fleet(run_path, chosen_format(fmt, as_json), width, html_path, probe_ceiling, drive_tbw,
                            drive_capacity)
    run = load_run(run_path)
    inputs = gather_inputs(run, probe_ceiling, drive_tbw, drive_capacity, say)
    judged = trace_report(run, inputs)
    emit(judged, chosen_format(fmt, as_json), width, block_size)
    write_html(judged, html_path)


def report_fleet(path: Path, fmt: str, width: int | None, html_path: Path | None, probe_ceiling: bool,
                 drive_tbw: int | None, drive_capacity: int | None) -> None:
    if probe_ceiling:
        raise UsageError("--ceiling probes this machine's devices, not a fleet's nodes: run `iotune report "
                         f"{path}/nodes/HOST --ceiling` on that node")
    show_fleet(load_fleet(path), fmt, width, html_path, drive_tbw, drive_capacity)


def show_fleet(fleet: FleetRun, fmt: str, width: int | None, html_path: Path | None, drive_tbw: int | None,
               drive_capacity: int | None) -> None:
    from ..analysis.fleet import fleet_report
    from ..model.verdict import VerdictInputs

    inputs = VerdictInputs(drive_tbw_bytes=float(drive_tbw) if drive_tbw else None,
                           tbw_source="--drive-tbw" if drive_tbw else "",
                           drive_capacity_bytes=float(drive_capacity) if drive_capacity else None)
    judged = fleet_report(fleet, inputs)
    emit(judged, fmt, width)
    write_html(judged, html_path)


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
