"""Sweeping storage layouts together with the aio settings: RAID0 over 1..N
capped scratch drives (btrfs raid0 where md is missing), the issue-4 search
on each, and which dimension mattered most."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..blockdev.cgroup import Throttle, blkio_cgroup
from ..model.layout import BuildPlan
from ..model.sweep_result import Effects, LayoutResult, Progress
from ..volumes.layout import LayoutSpec, build_layout
from ..volumes.scratch import scratch_drive
from .executor import Target
from .pipeline import SweepRequest, run_sweep
from .space import Profile


def sweep_layouts(profile: Profile, executor: str, drives: int, cap_bytes_per_s: int, out_dir: Path,
                  mount_options: tuple[str, ...], fresh: bool, say: Callable[[str], None],
                  on_trial: Callable[[Progress], None] | None = None) -> list[LayoutResult]:
    results = []
    with contextlib.ExitStack() as stack:
        made = [stack.enter_context(scratch_drive(None, 1 << 30)) for _ in range(drives)]
        devs = [d.device for d in made]
        caps = [Throttle(d.number, read_bps=cap_bytes_per_s, write_bps=cap_bytes_per_s) for d in devs]
        cg = str(stack.enter_context(blkio_cgroup("layouts", caps))) if cap_bytes_per_s else None
        for n in range(1, drives + 1):
            spec = LayoutSpec(devices=tuple(d.path for d in devs[:n]), raid0=n > 1, fstype="btrfs",
                              mount_options=mount_options)
            mnt = made[0].image.parent / f"iotune-layout-{n}"
            with build_layout(spec, mnt, scratch=True) as vol:
                name = layout_name(vol.plan, n)
                say(f"layout {name}: {vol.plan.reason}")
                target = Target(mnt, profile.run.file_bytes, profile.run.files, cg,
                                profile.run.runtime_s or 2.0, profile.run.ramp_s or 0.5)
                req = SweepRequest(profile=profile, executor=executor, out_dir=out_dir / name, fresh=fresh,
                                   ceiling_bytes_per_s=float(cap_bytes_per_s * n) if cap_bytes_per_s else None,
                                   drive={"layout": name, "cap": cap_bytes_per_s})
                outcome = run_sweep(req, target, on_trial, say)
                results.append(LayoutResult(name, n, vol.plan.backend, vol.plan.reason, outcome))
    return results


def layout_name(plan: BuildPlan, drives: int) -> str:
    """Named by what was built: `<fs>-1` for one drive, else `md-raid0-N` or
    `btrfs-raid0-N` by the RAID backend actually used."""
    if drives == 1 or plan.backend == "single":
        return f"{plan.fstype}-1"
    return f"{plan.backend}-raid0-{drives}"


def effects(results: list[LayoutResult]) -> Effects:
    bests = [r.outcome.ranking[0].median for r in results if r.outcome.ranking and r.outcome.ranking[0].scores]
    layout = max(bests) / min(bests) if bests and min(bests) > 0 else 1.0
    aio = 1.0
    for r in results:
        scores = [x.median for x in r.outcome.ranking if x.scores and x.median > 0]
        if scores:
            aio = max(aio, max(scores) / min(scores))
    return Effects(layout, aio)


def quick_profile(profile: Profile) -> Profile:
    """Layouts multiply the trials: no training-step confirmation per layout."""
    return replace(profile, run=replace(profile.run, confirm_top=0))
