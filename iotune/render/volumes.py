"""`iotune volumes build --dry-run`: the plan as the commands it would run,
and what the real build would refuse; `iotune volumes bed`: a test bed and
the bandwidth each aio setting should reach there."""

from __future__ import annotations

from collections.abc import Sequence

from ..model.bed import DEEPSPEED_DEFAULT_POINT, AioPoint, BedSpec
from ..model.layout import BuildPlan, Finding, LayoutSpec


def render_build_plan(plan: BuildPlan, spec: LayoutSpec, refusals: Sequence[Finding] = ()) -> str:
    lines = [f"# backend: {plan.backend} ({plan.reason})"]
    if refusals:
        names = " ".join(sorted({r.device for r in refusals}))
        lines.append("# REFUSED: the real build would stop before running anything below:")
        lines += [f"#   {r.device} {r.what}" for r in refusals]
        lines.append(f"# to destroy that data anyway, add: --destroy-data {names}")
    lines += [f"# for each member: echo {v} > /sys/block/<dev>/queue/{k}" for k, v in spec.queue.items()]
    lines += [" ".join(argv) for argv in plan.commands]
    return "\n".join(lines) + "\n"


BED_TABLE_BLOCKS = (128 << 10, 1 << 20, 4 << 20)
BED_TABLE_DEPTHS = (1, 8, 32)


def bed_points(spec: BedSpec) -> list[AioPoint]:
    """The settings a bed's table shows: its showcase, then a small grid."""
    grid = [AioPoint(bs, qd) for bs in BED_TABLE_BLOCKS for qd in BED_TABLE_DEPTHS]
    return list(dict.fromkeys([*spec.showcase, *grid]))


def render_bed_table(spec: BedSpec) -> str:
    """Each setting's expected bandwidth (Little's law, one direction), in
    MB/s decimal and against the bed's ceiling."""
    ceiling = spec.ceiling_bytes_per_s()
    lines = [f"{'aio setting':<16} {'expected MB/s':>14} {'of ceiling':>10}"]
    for p in bed_points(spec):
        bw = spec.expected_bytes_per_s(p)
        tag = "  (DeepSpeed's defaults)" if p == DEEPSPEED_DEFAULT_POINT else ""
        lines.append(f"{p.label():<16} {bw / 1e6:>14,.0f} {bw / ceiling:>9.0%}{tag}")
    return "\n".join(lines) + "\n"


def render_bed(spec: BedSpec, path: str, devices: Sequence[str], cgroup: str | None) -> str:
    """`iotune volumes bed NAME`: where the bed is, its limits and table."""
    lines = [f"bed       {spec.name}: {spec.stands_for}",
             f"mount     {path}",
             f"devices   {' '.join(devices)}",
             f"cgroup    {cgroup or '-'}  (run I/O in it for the caps to apply)",
             f"limits    {spec.describe()}",
             f"overhead  {spec.member.overhead_us:.0f} µs per request (measured at start)",
             f"ceiling   {spec.ceiling_bytes_per_s() / 1e6:,.0f} MB/s",
             f"shows     {spec.behaviour}",
             f"cannot    {spec.cannot_show}", ""]
    return "\n".join(lines) + render_bed_table(spec)
