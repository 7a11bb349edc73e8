"""What `iotune sweep --offload --what-if` needs to know about ZenFlow's
knobs (topk_ratio, update_interval): which config can vary them, and how
long a trial must run to measure them. Like every what-if, they change the
training itself: reported, never searched or applied."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .offload_runner import TrialPlan

ZENFLOW_TOPK = "zero_optimization.zenflow.topk_ratio"
ZENFLOW_UPDATE = "zero_optimization.zenflow.update_interval"
ZENFLOW_WHAT_IF = (ZENFLOW_TOPK, ZENFLOW_UPDATE)
ZENFLOW_AUTO_INTERVAL = 4       # steps a trial covers per update when update_interval is "auto"


def what_if_refusal(what_if: tuple[str, tuple[float, ...]] | None, cfg: dict[str, Any]) -> str | None:
    """Why `what_if` cannot run on `cfg` (None: it can): a ZenFlow knob needs
    a config with ZenFlow on, or the what-if would turn ZenFlow on."""
    if what_if is None or what_if[0] not in ZENFLOW_WHAT_IF:
        return None
    if isinstance((cfg.get("zero_optimization") or {}).get("zenflow"), dict):
        return None
    return (f"--what-if {what_if[0].rsplit('.', 1)[1]}: the config has no zero_optimization.zenflow block, so there "
            f"is no ZenFlow to vary; turning ZenFlow on is not a what-if (it changes the optimizer): add the block to "
            f"--ds-config, or vary grad_accum or micro_batch")


def zenflow_interval(cfg: dict[str, Any], key: str = "", value: float = 0.0) -> int:
    """Steps between ZenFlow's CPU updates in the trial: the update_interval
    being tried, else the config's (ZENFLOW_AUTO_INTERVAL for "auto")."""
    if key == ZENFLOW_UPDATE:
        return int(value)
    given = ((cfg.get("zero_optimization") or {}).get("zenflow") or {}).get("update_interval")
    return given if isinstance(given, int) and given > 0 else ZENFLOW_AUTO_INTERVAL


def what_if_plan(plan: TrialPlan, key: str, value: float, cfg: dict[str, Any]) -> TrialPlan:
    """A ZenFlow trial runs the first step and two whole update intervals,
    never ended early: its steps differ by design (the CPU update lands on
    every update_interval-th step), so steady steps agreeing says nothing."""
    if key not in ZENFLOW_WHAT_IF:
        return plan
    steps = max(plan.steps, 1 + 2 * zenflow_interval(cfg, key, value))
    return replace(plan, steps=steps, min_steps=steps)
