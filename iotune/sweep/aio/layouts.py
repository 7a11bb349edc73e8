"""Sweeping storage layouts together with the aio settings: RAID0 over 1..N
capped scratch drives (btrfs raid0 where md is missing), optionally each on
several filesystems with the mount options that matter for O_DIRECT swap
files (FS_VARIANTS), the issue-4 search on each, all ranked on the same
scale, and which dimension mattered most."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ...host.cgroup import Throttle, blkio_cgroup
from ...errors import UsageError
from ...model.layout import BuildPlan
from ...model.sweep_result import Effects, LayoutResult, Progress
from ...volumes.layout import LayoutSpec, build_layout, md_available
from ...volumes.scratch import scratch_drive
from ..executor import Target
from .pipeline import SweepRequest, run_sweep
from ..space import Profile

# (label, mount options) per filesystem, the recommended variant first: the
# options that change what O_DIRECT swap writes cost. btrfs copy-on-write
# writes new extents (and checksums) on every overwrite: nodatacow avoids it;
# ext4's data= journaling mode is asked about often, so it is measured too.
FS_VARIANTS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "xfs": (("", ("noatime",)),),
    "ext4": (("", ("noatime",)), ("writeback", ("noatime", "data=writeback"))),
    "btrfs": (("", ("noatime", "nodatacow")), ("cow", ("noatime",))),
}


def fs_variants(filesystems: tuple[str, ...] | None,
                mount_options: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(fstype, label, mount options) to build: every variant of each of
    `filesystems`, or, without them, btrfs with `mount_options` only."""
    if not filesystems:
        return [("btrfs", "", mount_options)]
    bad = [f for f in filesystems if f not in FS_VARIANTS]
    if bad:
        raise UsageError(f"--filesystems {bad[0]}: choose from {', '.join(FS_VARIANTS)}")
    return [(fs, label, opts) for fs in dict.fromkeys(filesystems) for label, opts in FS_VARIANTS[fs]]


def sweep_layouts(profile: Profile, executor: str, drives: int, cap_bytes_per_s: int, out_dir: Path,
                  mount_options: tuple[str, ...], fresh: bool, say: Callable[[str], None],
                  on_trial: Callable[[Progress], None] | None = None,
                  filesystems: tuple[str, ...] | None = None) -> list[LayoutResult]:
    variants = fs_variants(filesystems, mount_options)
    results = []
    with contextlib.ExitStack() as stack:
        made = [stack.enter_context(scratch_drive(None, 1 << 30)) for _ in range(drives)]
        devs = [d.device for d in made]
        caps = [Throttle(d.number, read_bps=cap_bytes_per_s, write_bps=cap_bytes_per_s) for d in devs]
        cg = str(stack.enter_context(blkio_cgroup("layouts", caps))) if cap_bytes_per_s else None
        for n in range(1, drives + 1):
            for fstype, label, opts in variants:
                if n > 1 and fstype != "btrfs" and not md_available()[0]:
                    say(f"layout {fstype}-raid0-{n}: skipped: {md_available()[1]}, and only btrfs stripes "
                        f"without md")
                    continue
                spec = LayoutSpec(devices=tuple(d.path for d in devs[:n]), raid0=n > 1, fstype=fstype,
                                  mount_options=opts)
                mnt = made[0].image.parent / f"iotune-layout-{n}-{fstype}{label}"
                with build_layout(spec, mnt, scratch=True) as vol:
                    md_fs = filesystems and n > 1 and vol.plan.backend == "md"   # md carries any fs
                    name = layout_name(vol.plan, n, "-".join(x for x in (fstype, label) if x) if md_fs else label)
                    say(f"layout {name} ({fstype}, {','.join(opts)}): {vol.plan.reason}")
                    target = Target(mnt, profile.run.file_bytes, profile.run.files, cg,
                                    profile.run.runtime_s or 2.0, profile.run.ramp_s or 0.5)
                    ceiling = float(cap_bytes_per_s * n) if cap_bytes_per_s else None
                    req = SweepRequest(profile=profile, executor=executor, out_dir=out_dir / name, fresh=fresh,
                                       ceiling_bytes_per_s=ceiling, drive={"layout": name, "cap": cap_bytes_per_s})
                    outcome = run_sweep(req, target, on_trial, say)
                    results.append(LayoutResult(name, n, vol.plan.backend, vol.plan.reason, outcome,
                                                vol.plan.fstype, opts))
    return results


def layout_name(plan: BuildPlan, drives: int, label: str = "") -> str:
    """Named by what was built: `<fs>-1` for one drive, else `md-raid0-N` or
    `btrfs-raid0-N` by the RAID backend actually used; a mount-option
    variant's label follows the filesystem or backend (`btrfs-cow-1`)."""
    tag = f"-{label}" if label else ""
    if drives == 1 or plan.backend == "single":
        return f"{plan.fstype}{tag}-1"
    return f"{plan.backend}-raid0{tag}-{drives}"


def effects(results: list[LayoutResult]) -> Effects:
    bests = [r.best() for r in results if r.best() > 0]
    layout = max(bests) / min(bests) if bests and min(bests) > 0 else 1.0
    aio = 1.0
    for r in results:
        scores = [x.median for x in r.outcome.ranking if x.scores and x.median > 0]
        if scores:
            aio = max(aio, max(scores) / min(scores))
    by_drives = _spread(results, lambda r: r.drives, lambda r: (r.fstype, r.mount_options))
    by_variant = _spread(results, lambda r: (r.fstype, r.mount_options), lambda r: r.drives)
    return Effects(layout, aio, by_drives, by_variant)


def _spread(results: list[LayoutResult], group: Callable[[LayoutResult], object],
            varies: Callable[[LayoutResult], object]) -> float:
    """The largest best/worst ratio of best scores within a group whose
    members differ in `varies` (1.0 where none do)."""
    groups: dict[object, list[LayoutResult]] = {}
    for r in results:
        if r.best() > 0:
            groups.setdefault(group(r), []).append(r)
    ratio = 1.0
    for members in groups.values():
        if len({varies(r) for r in members}) > 1:
            ratio = max(ratio, max(r.best() for r in members) / min(r.best() for r in members))
    return ratio


def quick_profile(profile: Profile) -> Profile:
    """Layouts multiply the trials: no training-step confirmation per layout."""
    return replace(profile, run=replace(profile.run, confirm_top=0))
