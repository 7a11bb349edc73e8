"""The option groups of `iotune trace`, each handed to the command as one
frozen dataclass (options.option_group): what to trace, how to run it, and
where to save the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from .options import F, option_group, out_option


@dataclass(frozen=True)
class TargetOptions:
    """-d, -p, --app and --with-lower: what is traced."""

    devices: tuple[str, ...]
    paths: tuple[str, ...]
    app_layer: bool
    with_lower: bool


@dataclass(frozen=True)
class RunOptions:
    """--duration, --interval, --no-inject, --linger and --as-root: how the
    command (or the time window) is traced."""

    duration: float | None
    interval: float | None
    no_inject: bool
    linger: float
    as_root: bool


@dataclass(frozen=True)
class SaveOptions:
    """-o/--out and --no-save."""

    out: Path | None
    no_save: bool


def target_options(fn: F) -> F:
    return option_group(
        TargetOptions, "targets",
        click.option("-d", "--device", "devices", multiple=True, metavar="DEV",
                     help="Trace only this block device: name (loop0), /dev path or MAJ:MIN. Repeatable."),
        click.option("-p", "--path", "paths", multiple=True, metavar="PATH",
                     help="Trace the device(s) holding PATH, e.g. your nvme_path (btrfs: every member). "
                          "Repeatable."),
        click.option("--app", "app_layer", is_flag=True,
                     help="Also trace the application layer: every read and write the command's processes "
                          "submit (read/write/pread/pwrite/sendfile, libaio, io_uring), per file, next to the block "
                          "requests. On by itself for a --path with no block device (FUSE, NFS)."),
        click.option("--with-lower", is_flag=True,
                     help="Also trace what the chosen devices sit on (a loop device's backing disk), "
                          "reported separately and never added to totals."),
    )(fn)


def run_options(fn: F) -> F:
    return option_group(
        RunOptions, "how",
        click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
                     help="No command: trace for S seconds (Ctrl-C ends early)."),
        click.option("--interval", type=click.FloatRange(0.001, 3600), default=None, metavar="S",
                     help="Timeline resolution in seconds (default 1, or 0.01 when attributing I/O to "
                          "training phases)."),
        click.option("--no-inject", is_flag=True,
                     help="Do not inject the attribution hooks into Python commands (phases and "
                          "DeepSpeed swap I/O are then not reported)."),
        click.option("--linger", type=click.FloatRange(0, 3600), default=0.0, metavar="S",
                     help="Keep tracing S seconds after the command ends (to catch delayed writeback)."),
        click.option("--as-root", is_flag=True,
                     help="Under sudo, run the command as root (default: as the user who ran sudo)."),
    )(fn)


def save_options(fn: F) -> F:
    return option_group(
        SaveOptions, "save",
        out_option("Save the run here (default: ./iotune-runs/<time>-<command>)."),
        click.option("--no-save", is_flag=True, help="Do not save the run."),
    )(fn)
