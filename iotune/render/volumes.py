"""`iotune volumes build --dry-run`: the plan as the commands it would run,
and what the real build would refuse."""

from __future__ import annotations

from collections.abc import Sequence

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
