"""`iotune sweep layouts` and `iotune sweep netfs`: the aio search over
several storage layouts, or over a network filesystem's client knobs,
ranked together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from ...errors import UsageError
from ..options import (F, csv_list, drive_cap_option, emit, html_option, library_errors, option_group, resumable,
                       say, write_html)
from .aio import SearchOptions, search_options, sweep_args
from ..groups import FormatOutput, sections
from .groups import DriveOptions, JournalOptions, SweepCommand, journal_options, output_options


@dataclass(frozen=True)
class LayoutOptions:
    """The scratch drives and filesystems to build and compare."""

    drives: int
    filesystems: tuple[str, ...] | None
    drive_cap: float


def layout_options(fn: F) -> F:
    return option_group(
        LayoutOptions, "layout",
        click.option("--drives", type=click.IntRange(1, 8), default=2, show_default=True, metavar="N",
                     help="RAID0 over 1..N capped scratch drives (btrfs raid0 where md is missing), the aio search "
                          "on each, ranked together."),
        click.option("--filesystems", callback=csv_list(str), default=None, metavar="LIST",
                     help="Also search the filesystem, e.g. xfs,ext4,btrfs, each with the mount options that "
                          "matter for O_DIRECT swap files (ext4: ordered and data=writeback; btrfs: nodatacow and "
                          "copy-on-write), all ranked on one scale. Default: btrfs, noatime,nodatacow."),
        drive_cap_option(was_cap=False),
    )(fn)


@click.command("layouts", cls=SweepCommand, groups=sections(
    ("Layouts", LayoutOptions), ("aio search", SearchOptions), ("Journal", JournalOptions),
    ("Output", FormatOutput)))
@layout_options
@search_options
@journal_options("Journal directory (default iotune-sweeps/<profile>-<executor>-layouts). An existing journal is "
                 "resumed.")
@output_options
@html_option
@library_errors
def layouts(layout: LayoutOptions, search: SearchOptions, journal: JournalOptions, output: FormatOutput,
            html_path: Path | None) -> None:
    """Compare storage layouts for the swap: RAID0 over 1..N capped scratch
    drives, and with --filesystems the filesystem and its mount options,
    each searched with the aio sweep and ranked on one scale.

    \b
    Examples:
      sudo iotune sweep layouts --drives 3
      sudo iotune sweep layouts --drives 2 --filesystems xfs,ext4,btrfs --drive-cap 400MB/s
    """
    from ...render.progress import sweep_progress
    from ...sweep.aio.command import run_layouts_command

    args = sweep_args(DriveOptions(None, None), search, journal)
    with resumable(), sweep_progress() as on_trial:
        result = run_layouts_command(args, layout.drives, int(layout.drive_cap), say, on_trial,
                                     tuple(layout.filesystems) if layout.filesystems else None)
    emit(result, output.format)
    write_html(result, html_path)


@click.command("netfs", cls=SweepCommand, groups=sections(
    ("aio search", SearchOptions), ("Journal", JournalOptions), ("Output", FormatOutput)))
@click.option("--path", "target_dir", type=click.Path(path_type=Path), required=True, metavar="DIR",
              help="A directory on the network filesystem to tune (Lustre or NFS).")
@click.option("--dry-run", is_flag=True, help="Print every command it would run, run none.")
@search_options
@journal_options("Journal directory (default iotune-sweeps/<profile>-<executor>-netfs). An existing journal is "
                 "resumed.")
@output_options
@html_option
@library_errors
def netfs(target_dir: Path, dry_run: bool, search: SearchOptions, journal: JournalOptions, output: FormatOutput,
          html_path: Path | None) -> None:
    """Tune the client knobs of the network filesystem holding --path:
    Lustre (max_rpcs_in_flight, max_pages_per_rpc, the swap directory's
    striping) or NFS (rsize, wsize, nconnect, on a second mount of the
    export). Each is set, searched with the aio sweep and set back; ranked
    together.

    \b
    Examples:
      sudo iotune sweep netfs --path /lustre/swap --dry-run
      sudo iotune sweep netfs --path /mnt/nfs/swap --profile quick
    """
    if dry_run:
        if output.format == "json" or html_path is not None:
            flag = "--json" if output.format == "json" else "--html"
            raise UsageError(f"--dry-run prints the commands a netfs sweep would run, as text: drop {flag}")
        from ...sweep.aio.netfs import dry_run as netfs_dry_run
        click.echo("\n".join(netfs_dry_run(target_dir)))
        return
    from ...render.progress import sweep_progress
    from ...sweep.aio.command import run_netfs_command

    args = sweep_args(DriveOptions(target_dir, None), search, journal)
    with resumable(), sweep_progress() as on_trial:
        result = run_netfs_command(args, say, on_trial)
    emit(result, output.format)
    write_html(result, html_path)
