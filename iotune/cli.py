"""The `iotune` command line: parse, call the library, render, and map
IotuneError to exit codes. Nothing else in iotune imports this module."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from . import __version__
from .errors import IotuneError, UsageError
from .model.run import RecordFormatError, TraceRun
from .model.runfile import load_run, save_run
from .model.units import parse_size

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def library_errors(fn: F) -> F:
    """Turn library exceptions into clean messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except IotuneError as e:
            raise CliError(str(e), e.exit_code) from None
        except RecordFormatError as e:
            raise CliError(f"cannot load run: {e}", 2) from None

    return wrapper  # type: ignore[return-value]


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeType()


class RateType(click.ParamType):
    name = "RATE"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        text = str(value).strip()
        text = text[:-2] if text.lower().endswith("/s") else text
        try:
            return float(parse_size(text))
        except ValueError:
            self.fail(f"'{value}' is not a rate: use e.g. 3GB/s, 200MB/s (decimal) or 2GiB/s", param, ctx)


def output_options(fn: F) -> F:
    """--json and --block-size, shared by every command that renders a run."""
    fn = click.option("--json", "as_json", is_flag=True,
                      help="Print the run as JSON on stdout (and nothing else there).")(fn)
    fn = click.option("--block-size", type=SIZE, default=None, metavar="SIZE",
                      help="Block size for the I/O-pattern table, e.g. 512K (the DeepSpeed aio "
                           "block_size). Default: each device's dominant request size.")(fn)
    fn = click.option("--width", type=click.IntRange(60, 400), default=None,
                      help="Report width in columns (default: the terminal's, at least 120).")(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="iotune")
def cli() -> None:
    """Profile and tune storage I/O for LLM training that offloads to NVMe.

    \b
    Start with:
      sudo iotune doctor                       check prerequisites
      sudo iotune demo                         trace a built-in offload-like workload
      sudo iotune trace -- deepspeed train.py  trace your own job
      iotune report iotune-runs/<run>          show a saved run again
    """


def emit(run: TraceRun, as_json: bool, block_size: int | None, width: int | None) -> None:
    from .render.console import ConsoleRenderer
    from .render.json import JsonRenderer

    if as_json:
        click.echo(JsonRenderer(block_size).render(run), nl=False)
        return
    w = width or max(120, shutil.get_terminal_size().columns)
    click.echo(ConsoleRenderer(width=w, color=sys.stdout.isatty(), block_size_bytes=block_size).render(run),
               nl=False)


def progress_printer() -> Callable[[float, int, int, int, int], None] | None:
    if not sys.stderr.isatty():
        return None
    from .render.units import seconds, volume

    def show(elapsed: float, rb: int, wb: int, rr: int, wr: int) -> None:
        sys.stderr.write(f"\r\x1b[2Ktracing · {seconds(elapsed)} · read {volume(rb)} ({rr:,} req) · "
                         f"written {volume(wb)} ({wr:,} req)")
        sys.stderr.flush()

    return show


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-d", "--device", "devices", multiple=True, metavar="DEV",
              help="Trace only this block device: name (loop0), /dev path or MAJ:MIN. Repeatable.")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
              help="Trace the device(s) holding PATH, e.g. your nvme_path (btrfs: every member). Repeatable.")
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
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Save the run here (default: ./iotune-runs/<time>-<command>).")
@click.option("--no-save", is_flag=True, help="Do not save the run.")
@click.option("--as-root", is_flag=True,
              help="Under sudo, run the command as root (default: as the user who ran sudo).")
@output_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@library_errors
def trace(devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool, duration: float | None,
          interval: float | None, no_inject: bool, linger: float, out: Path | None, no_save: bool, as_root: bool,
          as_json: bool, block_size: int | None, width: int | None, command: tuple[str, ...]) -> None:
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
    """
    from .blockdev.devices import devices_for_path, lower_devices, resolve_device
    from .trace.child import sudo_user
    from .trace.session import TraceOptions, default_run_dir, trace_command, trace_window

    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and duration is not None:
        raise UsageError("give either a command or --duration, not both")
    if not argv and duration is None:
        raise UsageError("nothing to trace: give a command after `--` (iotune trace -- CMD ARGS...) "
                         "or a window with --duration S")
    chosen = [resolve_device(d) for d in devices]
    for p in paths:
        chosen += devices_for_path(p)
    if with_lower:
        chosen += [low for dev in list(chosen) for low in lower_devices(dev)]
    chosen = list(dict.fromkeys(chosen))
    inject = bool(argv) and not no_inject
    opts = TraceOptions(devices=tuple(chosen), interval_s=interval or (0.01 if inject else 1.0),
                        linger_s=linger, run_as=None if as_root else sudo_user(),
                        stdout_to_stderr=as_json, inject=inject)
    progress = progress_printer()
    run = trace_command(argv, opts, progress) if argv else trace_window(duration or 0, opts, progress)
    if progress:
        sys.stderr.write("\r\x1b[2K")
    if not no_save:
        where = out or Path(default_run_dir("iotune-runs", argv))
        save_run(run, where)
        _chown_to_sudo_user(where)
        click.echo(f"saved {where}  (iotune report {where})", err=True)
    emit(run, as_json, block_size, width)
    if run.exit_status:
        sys.exit(run.exit_status)


def _chown_to_sudo_user(path: Path) -> None:
    """A run saved under sudo belongs to the user who ran sudo."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() != 0 or not uid or not gid:
        return
    for p in [path, *path.iterdir()]:
        try:
            os.chown(p, int(uid), int(gid))
        except OSError:
            pass


@cli.command()
@click.argument("run_path", metavar="RUN", type=click.Path(path_type=Path))
@output_options
@library_errors
def report(run_path: Path, as_json: bool, block_size: int | None, width: int | None) -> None:
    """Show a saved run again (RUN is its directory or run.json)."""
    emit(load_run(run_path), as_json, block_size, width)


def _sweep_layouts(args: Any, drives: int, cap: int, as_json: bool) -> None:
    from .render.progress import sweep_progress
    from .render.sweep import render_layouts, sweep_json
    from .sweep.command import build_profile
    from .sweep.layouts import effects, quick_profile, sweep_layouts

    prof = quick_profile(build_profile(args))
    out = args.out or Path("iotune-sweeps") / f"{prof.name}-{args.executor}-layouts"
    try:
        with sweep_progress() as on_trial:
            results = sweep_layouts(prof, args.executor, drives, cap, out, ("noatime", "nodatacow"), args.fresh,
                                    lambda msg: click.echo(msg, err=True), on_trial)
    except KeyboardInterrupt:
        click.echo("interrupted: finished trials are in the journals; run again to resume", err=True)
        sys.exit(130)
    eff = effects(results)
    if as_json:
        docs = [{"layout": r.name, "drives": r.drives, "backend": r.backend, "reason": r.reason,
                 "outcome": json.loads(sweep_json(r.outcome))} for r in results]
        click.echo(json.dumps({"layouts": docs, "layout_effect": eff.layout, "aio_effect": eff.aio,
                               "dominant": eff.dominant}, indent=1))
    else:
        click.echo(render_layouts(results, eff), nl=False)


def _csv_list(convert: Callable[[str], Any]) -> Callable[[Any, Any, str | None], tuple[Any, ...] | None]:
    def parse(ctx: Any, param: Any, value: str | None) -> tuple[Any, ...] | None:
        if not value:
            return None
        try:
            return tuple(convert(v.strip()) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(f"{value!r}: {e}") from None
    return parse


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError("values must be at least 1")
    return n


def _bool_word(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise ValueError("use true or false")


@cli.command()
@click.option("--path", "target_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="A directory on the drive to tune (your nvme_path). Default: a built-in emulated "
                   "drive with known limits.")
@click.option("--profile", default="default", show_default=True,
              help="Search space and run settings: a name from profiles/ (default, quick, "
                   "ds-nvme-tune-grid) or a TOML file.")
@click.option("--executor", type=click.Choice(["fio", "aio"]), default="fio", show_default=True,
              help="Measure with fio, or with DeepSpeed's own aio engine (aio_handle).")
@click.option("--block-sizes", callback=_csv_list(parse_size), default=None, metavar="LIST",
              help="Override the profile, e.g. 256K,1M,4M.")
@click.option("--queue-depths", callback=_csv_list(_positive_int), default=None, metavar="LIST",
              help="Override the profile, e.g. 4,8,32.")
@click.option("--threads", callback=_csv_list(_positive_int), default=None, metavar="LIST",
              help="intra_op_parallelism values (fio: numjobs), e.g. 1,2,4.")
@click.option("--single-submit", callback=_csv_list(_bool_word), default=None, metavar="LIST",
              help="e.g. false or false,true.")
@click.option("--overlap-events", callback=_csv_list(_bool_word), default=None, metavar="LIST")
@click.option("--engines", callback=_csv_list(str), default=None, metavar="LIST", help="fio: libaio,io_uring.")
@click.option("--grid", is_flag=True, help="Measure every combination instead of the adaptive search.")
@click.option("--repeats", type=click.IntRange(1, 50), default=None, help="Repeats of the finalists.")
@click.option("--file-bytes", type=SIZE, default=None, metavar="SIZE", help="Bytes per tensor file per trial.")
@click.option("--confirm", "confirm_top", type=click.IntRange(0, 10), default=None,
              help="Candidates to confirm with real training steps (0: none).")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Journal directory (default iotune-sweeps/<profile>-<executor>). An existing journal "
                   "is resumed.")
@click.option("--fresh", is_flag=True, help="Start over (the old journal is kept under a new name).")
@click.option("--apply", "apply_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="DS_CONFIG", help="Write DS_CONFIG with the recommendation applied to "
                                        "DS_CONFIG's name + .iotune.json.")
@click.option("--in-place", is_flag=True, help="With --apply: overwrite DS_CONFIG instead.")
@click.option("--export", "export_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="All trials as a table: .csv or .parquet.")
@click.option("--export-jobs", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Write the fio job file of every ranked point into DIR.")
@click.option("--layouts", "layout_drives", type=click.IntRange(1, 8), default=None, metavar="N",
              help="Also sweep storage layouts: RAID0 over 1..N capped scratch drives (btrfs raid0 where md "
                   "is missing), the search on each, ranked together.")
@click.option("--drive-cap", type=RateType(), default=100e6, show_default=True,
              help="With --layouts: bandwidth cap per scratch drive, e.g. 100MB/s.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout.")
@library_errors
def sweep(target_dir: Path | None, profile: str, executor: str, block_sizes: Any, queue_depths: Any,
          threads: Any, single_submit: Any, overlap_events: Any, engines: Any, grid: bool,
          repeats: int | None, file_bytes: int | None, confirm_top: int | None, out: Path | None, fresh: bool,
          apply_to: Path | None, in_place: bool, export_to: Path | None, export_jobs: Path | None,
          layout_drives: int | None, drive_cap: float, as_json: bool) -> None:
    """Tune DeepSpeed's aio settings (block size, queue depth, threads, submit
    modes) for a drive, and hand over a config DeepSpeed accepts as pasted.

    Each point writes and reads back tensor-sized files with O_DIRECT, the
    way ZeRO-Infinity's swapper does. The default adaptive search measures
    block size, then queue depth, then threads and submit modes around the
    best, then repeats the finalists and DeepSpeed's defaults; configs
    inside the noise tie and the cheaper one wins. The best candidates are
    then confirmed on real training steps. Every trial is journaled as it
    ends: Ctrl-C and re-run resumes where it stopped.

    \b
    Examples:
      sudo iotune sweep                                  built-in emulated drive
      sudo iotune sweep --path /mnt/nvme/swap --profile quick
      sudo iotune sweep --path /mnt/nvme/swap --executor aio --apply ds_config.json
    """
    from .render.progress import sweep_progress
    from .sweep.command import SweepArgs, build_profile, run_sweep_command

    args = SweepArgs(target_dir=target_dir, profile=profile, executor=executor,
                     overrides={"block_size": block_sizes, "queue_depth": queue_depths,
                                "intra_op_parallelism": threads, "single_submit": single_submit,
                                "overlap_events": overlap_events, "engine": engines},
                     grid=grid, repeats=repeats, file_bytes=file_bytes, confirm_top=confirm_top, out=out,
                     fresh=fresh)
    if layout_drives is not None:
        _sweep_layouts(args, layout_drives, int(drive_cap), as_json)
        return
    try:
        with sweep_progress() as on_trial:
            outcome, target = run_sweep_command(args, lambda msg: click.echo(msg, err=True), on_trial)
    except KeyboardInterrupt:
        click.echo("interrupted: every finished trial is in the journal; run the same command again "
                   "to resume", err=True)
        sys.exit(130)
    from .render.sweep import render_sweep, sweep_json

    if export_to is not None:
        from .analysis.sweep_frames import export_trials
        export_trials(Path(outcome.journal), export_to)
        click.echo(f"trials exported to {export_to}", err=True)
    if export_jobs is not None:
        from .sweep.fio_executor import fio_jobfile
        export_jobs.mkdir(parents=True, exist_ok=True)
        for r in outcome.ranking:
            (export_jobs / f"{r.point.key()}.fio").write_text(fio_jobfile(r.point, target))
        click.echo(f"{len(outcome.ranking)} fio job files in {export_jobs}", err=True)
    if apply_to is not None and outcome.fragment:
        from .sweep.recommend import apply_to_file
        written = apply_to_file(apply_to, outcome.fragment, in_place)
        click.echo(f"wrote {written}", err=True)
    click.echo(sweep_json(outcome) if as_json else render_sweep(outcome), nl=False)
    if outcome.recommended is None or outcome.validation_error:
        sys.exit(1)


@cli.command()
@click.argument("run_paths", metavar="RUN...", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@library_errors
def compare(run_paths: tuple[Path, ...], as_json: bool) -> None:
    """Compare saved runs side by side: step time, optimizer step, GB moved
    per step, dominant request size, bandwidth. The first run is the
    reference for the ratio column.

    \b
    Example:
      iotune compare iotune-runs/*-nvme-opt iotune-runs/*-zenflow iotune-runs/*-cpu
    """
    from .analysis.compare import compare_row, label_of
    from .render.compare import compare_json, render_compare

    rows = []
    for p in run_paths:
        run = load_run(p)
        rows.append(compare_row(run, label_of(run, p.name)))
    click.echo(compare_json(rows) if as_json else render_compare(rows), nl=False)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "model_size", default=None, metavar="PRESET",
              help="Model size preset (tiny … 16b) for the capacity and buffer-size checks.")
@click.option("--params", type=click.IntRange(min=1), default=None,
              help="Parameter count, for the nvme_path capacity check.")
@click.option("--strict", is_flag=True, help="Exit non-zero on warnings too.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@library_errors
def lint(config: Path, model_size: str | None, params: int | None, strict: bool, as_json: bool) -> None:
    """Check a DeepSpeed config for NVMe-offload mistakes, each with its fix:
    aio keys DeepSpeed ignores (num_threads), string booleans, a misplaced
    aio block, pinned memory over `ulimit -l` or RAM, an nvme_path that is
    missing, read-only, without O_DIRECT or too small, parameter-offload
    settings that crash DeepSpeed 0.19.x, ZenFlow on a non-CPU device.

    Exit status: 0 clean, 1 errors (or warnings with --strict), 2 bad input.
    """
    from .analysis.lint import lint as run_lint
    from .doctor.facts import gather
    from .render.lint import findings_json, render_findings
    from .workloads.presets import PRESETS

    from .dsconfig import read_ds_config

    cfg = read_ds_config(config)
    largest = None
    if model_size is not None:
        if model_size not in PRESETS:
            raise UsageError(f"unknown --model '{model_size}': choose one of {', '.join(PRESETS)}")
        shape = PRESETS[model_size]
        params = params or shape.param_count()
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)
    findings = run_lint(cfg, gather(cfg, params, largest))
    click.echo(findings_json(str(config), findings) if as_json else render_findings(str(config), findings), nl=False)
    if any(f.severity == "error" or strict for f in findings):
        sys.exit(1)


@cli.command()
@click.option("--model", "model_size", default=None, metavar="PRESET",
              help="A model shape: tiny, small, medium, 1b, 3b, 8b, 16b.")
@click.option("--params", type=click.IntRange(min=1), default=None, help="Or a parameter count.")
@click.option("--strategy", type=click.Choice(["baseline", "cpu", "nvme-opt", "nvme-all", "zenflow"]),
              default="nvme-opt", show_default=True)
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="Data-parallel ranks over all nodes.")
@click.option("--drive-bandwidth", type=RateType(), default=None, help="One drive's bandwidth, e.g. 3GB/s.")
@click.option("--drives", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--target-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Storage time per step to aim for: prints the bandwidth and drives needed.")
@click.option("--aio-block-size", type=SIZE, default=1 << 20, show_default=True,
              help="Tensors under max(1 MiB, this) are not swapped.")
@click.option("--check", "check_run", type=click.Path(path_type=Path), default=None, metavar="RUN",
              help="Compare the prediction with a traced run of the same model and strategy.")
@click.option("--json", "as_json", is_flag=True)
@library_errors
def plan(model_size: str | None, params: int | None, strategy: str, precision: str, grad_accum: int, gpus: int,
         drive_bandwidth: float | None, drives: int, target_step: float | None, aio_block_size: int,
         check_run: Path | None, as_json: bool) -> None:
    """NVMe capacity, GB moved per step, storage time and drives needed for
    an offloaded training job, from the 18-bytes-per-parameter accounting.

    \b
    Examples:
      iotune plan --model 16b --strategy nvme-opt --drive-bandwidth 3GB/s --drives 3
      iotune plan --params 8000000000 --strategy nvme-all --gpus 8 --target-step 5 --drive-bandwidth 6GB/s
      iotune plan --model tiny --strategy nvme-opt --check iotune-runs/<run>
    """
    from .analysis.calibration import check
    from .analysis.planner import make_plan
    from .model.plan import PlanInput
    from .render.plan import plan_json, render_check, render_plan
    from .workloads.presets import PRESETS, swappable_params

    if (model_size is None) == (params is None):
        raise UsageError("give the model as --model PRESET or --params N (one of them)")
    swappable = None
    if model_size is not None:
        if model_size not in PRESETS:
            raise UsageError(f"unknown --model '{model_size}': choose one of {', '.join(PRESETS)}")
        params = PRESETS[model_size].param_count()
        swappable = swappable_params(PRESETS[model_size], max(1 << 20, aio_block_size))
    inp = PlanInput(params=params or 0, strategy=strategy, precision=precision, grad_accum=grad_accum, gpus=gpus,
                    swappable_params=swappable, drive_bytes_per_s=drive_bandwidth, drives=drives,
                    target_step_s=target_step)
    result = make_plan(inp)
    rows = check(result, load_run(check_run)) if check_run else None
    if as_json:
        click.echo(plan_json(result, rows), nl=False)
        return
    click.echo(render_plan(result), nl=False)
    if rows is not None:
        click.echo(render_check(rows), nl=False)


@cli.group()
def volumes() -> None:
    """Test volumes: capped scratch drives and RAID0/filesystem layouts."""


def _wait_for_ctrl_c(message: str) -> None:
    import signal
    import threading

    click.echo(message, err=True)
    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
    click.echo("tearing down", err=True)


@volumes.command("scratch")
@click.option("--drives", type=click.IntRange(1, 16), default=1, show_default=True)
@click.option("--size", type=SIZE, default=1 << 30, show_default=True, help="Per drive, e.g. 2G.")
@click.option("--cap", type=RateType(), default=200e6, show_default=True,
              help="Bandwidth cap per drive (cgroup blkio), e.g. 200MB/s; 0 for none.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the image files go (default: a temporary directory).")
@library_errors
def volumes_scratch(drives: int, size: int, cap: float, workdir: Path | None) -> None:
    """Create N loop drives with direct I/O and a bandwidth cap each, print
    them, and keep them until Ctrl-C (then everything is removed). Run
    commands in the printed cgroup for the cap to apply to them."""
    from .volumes.scratch import scratch_drive

    with contextlib.ExitStack() as stack:
        made = [stack.enter_context(scratch_drive(workdir, size, int(cap))) for _ in range(drives)]
        for d in made:
            click.echo(f"{d.device.path}\t{d.image}\tcgroup {d.cgroup or '-'}")
        _wait_for_ctrl_c("drives ready; Ctrl-C to remove them")


@volumes.command("build")
@click.argument("devices", nargs=-1, required=True)
@click.option("--raid0", is_flag=True, help="Stripe the devices (md, or btrfs raid0 where md is missing).")
@click.option("--backend", type=click.Choice(["auto", "md", "btrfs"]), default="auto", show_default=True)
@click.option("--chunk", type=SIZE, default=512 << 10, show_default=True, help="md RAID0 chunk size.")
@click.option("--fs", "fstype", type=click.Choice(["xfs", "ext4", "btrfs"]), default="xfs", show_default=True)
@click.option("-o", "--mount-options", default="noatime", show_default=True, help="Comma-separated.")
@click.option("--queue", "queue", multiple=True, metavar="KNOB=VALUE",
              help="Per-member sysfs queue setting, e.g. read_ahead_kb=4096 (restored afterwards).")
@click.option("--mount-point", type=click.Path(file_okay=False, path_type=Path), default=Path("/mnt/iotune"),
              show_default=True)
@click.option("--destroy-data", multiple=True, metavar="DEV",
              help="Allow overwriting DEV even though it holds data or a system role. Repeat per device.")
@click.option("--dry-run", is_flag=True, help="Print every command it would run; touch nothing.")
@library_errors
def volumes_build(devices: tuple[str, ...], raid0: bool, backend: str, chunk: int, fstype: str,
                  mount_options: str, queue: tuple[str, ...], mount_point: Path, destroy_data: tuple[str, ...],
                  dry_run: bool) -> None:
    """Build a volume on DEVICES (mkfs, optional RAID0, mount), keep it until
    Ctrl-C, then tear it down. Devices that are mounted, partitioned, hold a
    signature, swap or the root filesystem are refused unless named with
    --destroy-data."""
    from .volumes.layout import LayoutSpec, build_layout, plan_layout

    knobs = {}
    for q in queue:
        k, sep, v = q.partition("=")
        if not sep:
            raise UsageError(f"--queue {q}: write KNOB=VALUE, e.g. read_ahead_kb=4096")
        knobs[k] = v
    from .blockdev.devices import resolve_device

    spec = LayoutSpec(devices=tuple(resolve_device(d).path for d in devices), raid0=raid0, backend=backend, chunk_bytes=chunk, fstype=fstype,
                      mount_options=tuple(o for o in mount_options.split(",") if o), queue=knobs)
    plan = plan_layout(spec, mount_point)
    if dry_run:
        click.echo(f"# backend: {plan.backend} ({plan.reason})")
        for k, v in knobs.items():
            click.echo(f"# for each member: echo {v} > /sys/block/<dev>/queue/{k}")
        for argv in plan.commands:
            click.echo(" ".join(argv))
        return
    with build_layout(spec, mount_point, destroy_data) as vol:
        click.echo(f"{vol.path}\t{vol.plan.backend}: {vol.plan.reason}")
        _wait_for_ctrl_c("volume ready; Ctrl-C to tear it down")


@cli.command()
@click.option("--fix", is_flag=True, help="Apply the safe fixes (mount tracefs, link headers and bcc, apt-get install).")
@click.option("--path", "odirect_path", type=click.Path(), default=None, metavar="DIR",
              help="Also check that DIR (your nvme_path) supports O_DIRECT.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@library_errors
def doctor(fix: bool, odirect_path: str | None, as_json: bool) -> None:
    """Check every prerequisite and print the fix for each failure."""
    from .doctor.checks import run_checks
    from .doctor.fixes import apply_fixes
    from .render.doctor import render_checks

    results = run_checks(odirect_path)
    if fix:
        for line in apply_fixes(results):
            click.echo(f"fixed: {line}", err=True)
        results = run_checks(odirect_path)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=1))
    else:
        click.echo(render_checks(results), nl=False)
    if not all(r.ok for r in results):
        sys.exit(1)


@cli.command()
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the scratch drive's image goes (default: a temporary directory).")
@click.option("--cap", type=SIZE, default=200_000_000, show_default=True, metavar="BYTES/S",
              help="Bandwidth cap of the scratch drive in bytes/s (e.g. 200MB); 0 for none.")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Save the run here (default: ./iotune-runs/<time>-demo).")
@click.option("--workload", type=click.Choice(["train", "fio"]), default="train", show_default=True,
              help="train: the built-in DeepSpeed workload (ZeRO-3, optimizer on the drive); fio: a "
                   "swap-like fio job (no DeepSpeed needed).")
@click.option("--steps", type=click.IntRange(2, 1000), default=8, show_default=True)
@output_options
@library_errors
def demo(workdir: Path | None, cap: int, out: Path | None, workload: str, steps: int, as_json: bool,
         block_size: int | None, width: int | None) -> None:
    """Trace the built-in offload workload on a capped scratch drive.

    Creates a loop drive over a file (direct I/O, ext4, bandwidth-capped with
    cgroup blkio: an NVMe stand-in with a known limit), trains the built-in
    tiny Llama with ZeRO-3 and the optimizer state swapped to that drive
    through DeepSpeed's aio (512 KiB blocks), traces it with phase and swap
    attribution, and prints the report. Everything it creates is removed
    afterwards, also on Ctrl-C.
    """
    from .demo import run_demo

    run = run_demo(workdir, cap, lambda msg: click.echo(msg, err=True), workload, steps)
    where = out or Path("iotune-runs") / f"{run.started_at.replace(':', '')[:15]}-demo"
    save_run(run, where)
    click.echo(f"saved {where}  (iotune report {where})", err=True)
    emit(run, as_json, block_size or 512 * 1024, width)


def main() -> None:
    cli(prog_name="iotune")
