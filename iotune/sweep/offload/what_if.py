"""`iotune sweep offload --what-if KEY=V1,V2,...`: the knobs it takes
(gradient accumulation, micro-batch, ZenFlow's topk_ratio and
update_interval), and for ZenFlow's which config can vary them and how long
a trial must run to measure them. Every what-if changes the training
itself: reported, never searched or applied."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import UsageError
from .runner import TrialPlan

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


WHAT_IF_KEYS = {"gradient_accumulation_steps": "gradient_accumulation_steps", "grad_accum": "gradient_accumulation_steps",
                "train_micro_batch_size_per_gpu": "train_micro_batch_size_per_gpu",
                "micro_batch": "train_micro_batch_size_per_gpu",
                ZENFLOW_TOPK: ZENFLOW_TOPK, "zenflow.topk_ratio": ZENFLOW_TOPK, "topk_ratio": ZENFLOW_TOPK,
                ZENFLOW_UPDATE: ZENFLOW_UPDATE, "zenflow.update_interval": ZENFLOW_UPDATE,
                "update_interval": ZENFLOW_UPDATE}


def parse_what_if(text: str) -> tuple[str, tuple[float, ...]]:
    """`grad_accum=1,4,8` -> ("gradient_accumulation_steps", (1, 4, 8));
    `topk_ratio=0.05,0.1` -> ("zero_optimization.zenflow.topk_ratio", (0.05, 0.1))."""
    key, sep, values = text.partition("=")
    if not sep or key.strip() not in WHAT_IF_KEYS:
        raise UsageError(f"--what-if {text!r}: give KEY=V1,V2,... with KEY one of gradient_accumulation_steps "
                         f"(grad_accum), train_micro_batch_size_per_gpu (micro_batch), or ZenFlow's topk_ratio and "
                         f"update_interval, e.g. grad_accum=1,4,8 or topk_ratio=0.05,0.1,0.2")
    name = WHAT_IF_KEYS[key.strip()]
    if name == ZENFLOW_TOPK:
        try:
            ratios = tuple(float(v) for v in values.split(",") if v.strip())
        except ValueError:
            ratios = ()
        if not ratios or not all(0 < r < 1 for r in ratios):
            raise UsageError(f"--what-if {text!r}: topk_ratio values are fractions between 0 and 1 (DeepSpeed's "
                             f"ZenFlow takes 0 < topk_ratio < 1), e.g. topk_ratio=0.05,0.1,0.2")
        return name, ratios
    try:
        parsed = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        parsed = ()
    if not parsed or min(parsed) < 1:
        raise UsageError(f"--what-if {text!r}: the values must be whole numbers >= 1, e.g. grad_accum=1,4,8")
    return name, tuple(float(v) for v in parsed)
