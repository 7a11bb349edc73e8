"""Every renderer, keyed by (record type, format): RENDERERS. A renderer is
a function `(record, RenderOptions) -> str` (base.py); adding an output
format means writing one and adding its entry here."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..model.checkpoint_sweep import CheckpointOutcome
from ..model.fleet_report import FleetReport
from ..model.fleet_sweep import FleetSweepReport
from ..model.offload_result import OffloadOutcome
from ..model.reports import Comparison, DoctorReport, LintReport, PlanReport
from ..model.run import TraceRun
from ..model.sweep_result import LayoutSweep, SweepOutcome
from ..model.verdict import TraceReport
from .base import Renderer, RenderOptions
from .checkpoint_sweep import checkpoint_console, checkpoint_json
from .compare import compare_console, compare_json
from .console import run_console, trace_console
from .doctor import doctor_console, doctor_json
from .fleet import fleet_console, fleet_json
from .fleet_sweep import fleet_sweep_console, fleet_sweep_json
from .html import compare_html, layouts_html, sweep_html, trace_html
from .html_fleet import fleet_html
from .json_trace import run_json, trace_json
from .lint import lint_console, lint_json
from .offload import offload_console, offload_json
from .plan import plan_console, plan_json
from .sweep import layouts_console, layouts_json, sweep_console, sweep_json

RENDERERS: dict[tuple[type, str], Renderer] = {
    (TraceRun, "console"): run_console,
    (TraceRun, "json"): run_json,
    (TraceReport, "console"): trace_console,
    (TraceReport, "json"): trace_json,
    (TraceReport, "html"): trace_html,
    (SweepOutcome, "console"): sweep_console,
    (SweepOutcome, "json"): sweep_json,
    (SweepOutcome, "html"): sweep_html,
    (LayoutSweep, "console"): layouts_console,
    (LayoutSweep, "json"): layouts_json,
    (LayoutSweep, "html"): layouts_html,
    (Comparison, "console"): compare_console,
    (Comparison, "json"): compare_json,
    (Comparison, "html"): compare_html,
    (PlanReport, "console"): plan_console,
    (PlanReport, "json"): plan_json,
    (LintReport, "console"): lint_console,
    (LintReport, "json"): lint_json,
    (DoctorReport, "console"): doctor_console,
    (DoctorReport, "json"): doctor_json,
    (FleetReport, "console"): fleet_console,
    (FleetReport, "json"): fleet_json,
    (FleetReport, "html"): fleet_html,
    (FleetSweepReport, "console"): fleet_sweep_console,
    (FleetSweepReport, "json"): fleet_sweep_json,
    (OffloadOutcome, "console"): offload_console,
    (OffloadOutcome, "json"): offload_json,
    (CheckpointOutcome, "console"): checkpoint_console,
    (CheckpointOutcome, "json"): checkpoint_json,
}


def formats_of(record_type: type) -> list[str]:
    return [fmt for (rt, fmt) in RENDERERS if rt is record_type]


def render(record: Any, fmt: str = "console", options: RenderOptions | None = None) -> str:
    """`record` in format `fmt`."""
    fn = RENDERERS.get((type(record), fmt))
    if fn is None:
        raise UsageError(f"no {fmt} output for {type(record).__name__}: choose "
                         f"{' or '.join(formats_of(type(record))) or 'another command'}")
    return fn(record, options or RenderOptions())
