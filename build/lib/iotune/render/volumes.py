"""`iotune volumes build --dry-run`: the plan as the commands it would run,
and what the real build would refuse; `iotune volumes bed`: a test bed and
the bandwidth each aio setting should reach there."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

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


# --json of the `iotune volumes` commands: one JSON document on stdout, printed
# as soon as the drives are up (they stay up until Ctrl-C), on one line so a
# reader of the pipe can take it line by line.

def _document(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True) + "\n"


def build_plan_json(plan: BuildPlan, spec: LayoutSpec, refusals: Sequence[Finding] = ()) -> str:
    """`iotune volumes build --dry-run --json`."""
    return _document({"backend": plan.backend, "reason": plan.reason, "fstype": plan.fstype,
                      "commands": [list(argv) for argv in plan.commands], "queue": dict(spec.queue),
                      "refused": [{"device": r.device, "what": r.what} for r in refusals]})


def volume_json(path: str, plan: BuildPlan) -> str:
    """`iotune volumes build --json`: the volume as built."""
    return _document({"mount": path, "backend": plan.backend, "reason": plan.reason, "fstype": plan.fstype,
                      "source": plan.mount_source, "stripe_bytes": plan.stripe_bytes})


def scratch_json(drives: Sequence[tuple[str, str, str | None]], cap_bytes_per_s: float) -> str:
    """`iotune volumes scratch --json`: (device, image file, cgroup) per drive."""
    return _document({"cap_bytes_per_s": cap_bytes_per_s,
                      "drives": [{"device": d, "image": image, "cgroup": cg} for d, image, cg in drives]})


def bed_json(spec: BedSpec, path: str, devices: Sequence[str], cgroup: str | None) -> str:
    """`iotune volumes bed NAME --json`: the bed, where it is, and each
    setting's expected bandwidth (bytes/s, one direction)."""
    expected = [{**vars(p), "bytes_per_s": spec.expected_bytes_per_s(p),
                 "deepspeed_defaults": p == DEEPSPEED_DEFAULT_POINT} for p in bed_points(spec)]
    return _document({"bed": spec.to_json(), "mount": path, "devices": list(devices), "cgroup": cgroup,
                      "ceiling_bytes_per_s": spec.ceiling_bytes_per_s(), "expected": expected})
