"""`iotune volumes`: capped scratch drives and RAID0/filesystem layouts."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from ..errors import UsageError
from ..volumes.beds import BEDS
from .options import SIZE, drive_cap_option, given, json_option, library_errors, say, wait_for_ctrl_c


@click.group()
def volumes() -> None:
    """Test volumes: capped scratch drives and RAID0/filesystem layouts."""


@volumes.command("scratch")
@click.option("--drives", type=click.IntRange(1, 16), default=1, show_default=True)
@click.option("--size", type=SIZE, default="1G", show_default=True, help="Per drive, e.g. 2G.")
@drive_cap_option()
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the image files go (default: a temporary directory).")
@json_option
@library_errors
def volumes_scratch(drives: int, size: int, drive_cap: float, workdir: Path | None, as_json: bool) -> None:
    """Create N loop drives with direct I/O and a bandwidth cap each, print
    them, and keep them until Ctrl-C (then everything is removed). Run
    commands in the printed cgroup for the cap to apply to them."""
    from ..volumes.scratch import scratch_drive

    with contextlib.ExitStack() as stack:
        made = [stack.enter_context(scratch_drive(workdir, size, int(drive_cap))) for _ in range(drives)]
        if as_json:
            from ..render.volumes import scratch_json
            click.echo(scratch_json([(d.device.path, str(d.image), str(d.cgroup) if d.cgroup else None)
                                     for d in made], drive_cap), nl=False)
        else:
            for d in made:
                click.echo(f"{d.device.path}\t{d.image}\tcgroup {d.cgroup or '-'}")
        wait_for_ctrl_c("drives ready; Ctrl-C to remove them")


def _beds_help() -> str:
    intro = ("Bring up a named test bed (an emulated drive with known limits, see `iotune sweep --bed`), "
             "print its mount path, devices, cgroup, limits and the bandwidth each aio setting should "
             "reach there by Little's law, and keep it until Ctrl-C (then everything is removed). Run "
             "I/O in the printed cgroup for the caps to apply.")
    lines = [intro, "", "Beds:", ""]
    for b in BEDS.values():
        lines += ["\b", f"{b.name}  ({b.describe()})", f"  stands for: {b.stands_for}",
                  f"  shows: {b.behaviour}", f"  cannot show: {b.cannot_show}", ""]
    return "\n".join(lines)


@volumes.command("bed", help=_beds_help())
@click.argument("name", type=click.Choice(list(BEDS)))
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the drive files go (default: a temporary directory).")
@json_option
@library_errors
def volumes_bed(name: str, workdir: Path | None, as_json: bool) -> None:
    from ..render.volumes import bed_json, render_bed
    from ..volumes.beds import running_bed

    with running_bed(name, workdir) as bed:
        show = bed_json if as_json else render_bed
        click.echo(show(bed.spec, str(bed.path), [d.path for d in bed.devices], bed.cgroup), nl=False)
        wait_for_ctrl_c("bed ready; Ctrl-C to remove it")
    say("bed removed")


@volumes.command("build")
@click.argument("devices", nargs=-1, required=True)
@click.option("--raid0", is_flag=True, help="Stripe the devices (md, or btrfs raid0 where md is missing).")
@click.option("--backend", type=click.Choice(["auto", "md", "btrfs"]), default="auto", show_default=True)
@click.option("--chunk", type=SIZE, default="512K", show_default=True, help="With --raid0: md RAID0 chunk size.")
@click.option("--fs", "fstype", type=click.Choice(["xfs", "ext4", "btrfs"]), default="xfs", show_default=True)
@click.option("--mount-options", default="noatime", show_default=True, metavar="OPTS",
              help="Comma-separated mount options, e.g. noatime,nodatacow.")
@click.option("--queue", "queue", multiple=True, metavar="KNOB=VALUE",
              help="Per-member sysfs queue setting, e.g. read_ahead_kb=4096 (restored afterwards).")
@click.option("--mount-point", type=click.Path(file_okay=False, path_type=Path), default=Path("/mnt/iotune"),
              show_default=True)
@click.option("--destroy-data", multiple=True, metavar="DEV",
              help="Allow overwriting DEV even though it holds data or a system role. Repeat per device.")
@click.option("--dry-run", is_flag=True, help="Print every command it would run and what the safety "
                                              "checks would refuse; touch nothing. Exits 1 when the real "
                                              "build would be refused.")
@json_option
@library_errors
def volumes_build(devices: tuple[str, ...], raid0: bool, backend: str, chunk: int, fstype: str,
                  mount_options: str, queue: tuple[str, ...], mount_point: Path, destroy_data: tuple[str, ...],
                  dry_run: bool, as_json: bool) -> None:
    """Build a volume on DEVICES (mkfs, optional RAID0, mount), keep it until
    Ctrl-C, then tear it down. Devices that are mounted, partitioned, hold a
    signature, swap or the root filesystem are refused unless named with
    --destroy-data."""
    refuse_inert_build(devices, raid0, backend, fstype)
    from ..blockdev.devices import resolve_device
    from ..render.volumes import build_plan_json, render_build_plan, volume_json
    from ..volumes.layout import LayoutSpec, build_layout, parse_queue_settings, plan_layout
    from ..volumes.safety import refusals, refused_error

    spec = LayoutSpec(devices=tuple(resolve_device(d).path for d in devices), raid0=raid0, backend=backend,
                      chunk_bytes=chunk, fstype=fstype, mount_options=tuple(o for o in mount_options.split(",") if o),
                      queue=parse_queue_settings(queue))
    plan = plan_layout(spec, mount_point)
    if dry_run:
        problems = refusals(spec.devices, destroy_data)
        click.echo((build_plan_json if as_json else render_build_plan)(plan, spec, problems), nl=False)
        if problems:      # exit as the real build would: a dry run that passes means the build would go ahead
            raise refused_error(problems)
        return
    with build_layout(spec, mount_point, destroy_data) as vol:
        if as_json:
            click.echo(volume_json(str(vol.path), vol.plan), nl=False)
        else:
            click.echo(f"{vol.path}\t{vol.plan.backend}: {vol.plan.reason}")
        wait_for_ctrl_c("volume ready; Ctrl-C to tear it down")
    say("volume removed")


def refuse_inert_build(devices: tuple[str, ...], raid0: bool, backend: str, fstype: str) -> None:
    """Options that would do nothing in this combination are refused, each with its fix."""
    if not raid0:
        inert = [flag for flag, name in (("--backend", "backend"), ("--chunk", "chunk")) if given(name)]
        if inert:
            raise UsageError(f"{inert[0]} sets how --raid0 stripes the devices: add --raid0, or drop {inert[0]}")
    elif len(devices) < 2:
        raise UsageError("--raid0 stripes two or more devices: give more DEVICES, or drop --raid0")
    if backend == "btrfs" and given("chunk"):
        raise UsageError("--chunk is md's stripe; btrfs raid0 stripes in fixed 64 KiB: drop --chunk, or use "
                         "--backend md")
    if backend == "btrfs" and given("fstype") and fstype != "btrfs":
        raise UsageError(f"--backend btrfs builds a btrfs raid0, not {fstype}: drop --fs {fstype}, or use "
                         f"--backend md")
