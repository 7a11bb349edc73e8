"""`iotune volumes build --dry-run`: the plan as the commands it would run."""

from __future__ import annotations

from ..model.layout import BuildPlan, LayoutSpec


def render_build_plan(plan: BuildPlan, spec: LayoutSpec) -> str:
    lines = [f"# backend: {plan.backend} ({plan.reason})"]
    lines += [f"# for each member: echo {v} > /sys/block/<dev>/queue/{k}" for k, v in spec.queue.items()]
    lines += [" ".join(argv) for argv in plan.commands]
    return "\n".join(lines) + "\n"
