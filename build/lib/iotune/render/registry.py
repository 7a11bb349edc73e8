"""Every renderer, keyed by (record type, format). Adding an output format
means adding a Renderer subclass and one entry in RENDERERS."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..model.reports import Comparison, DoctorReport, PlanReport
from ..model.run import TraceRun
from ..model.sweep_result import LayoutSweep, SweepOutcome
from ..model.verdict import TraceReport
from .base import Renderer, RenderOptions
from .compare import compare_json, render_compare
from .console import ConsoleRenderer
from .doctor import doctor_json, render_checks
from .fleet import FleetConsole, FleetJson
from .fleet_sweep import FleetSweepConsole, FleetSweepJson
from .html import HTML_RENDERERS
from .html_fleet import FleetHtml
from .json import JsonRenderer
from .lint import LintReportConsole, LintReportJson
from .offload import OffloadConsole, OffloadJson
from .plan import plan_json, render_check, render_endurance, render_plan
from .sweep import layouts_json, render_layouts, render_sweep, sweep_json


class TraceConsole(Renderer):
    record_type, format, file_extension = TraceRun, "console", "txt"

    def render(self, record: TraceRun) -> str:
        o = self.options
        return ConsoleRenderer(width=o.width or 120, color=o.color, block_size_bytes=o.block_size_bytes).render(record)


class TraceJson(Renderer):
    record_type, format, file_extension = TraceRun, "json", "json"

    def render(self, record: TraceRun) -> str:
        return JsonRenderer(self.options.block_size_bytes).render(record)


class TraceReportConsole(Renderer):
    """A trace report: the verdict at the top, then the run's report."""

    record_type, format, file_extension = TraceReport, "console", "txt"

    def render(self, record: TraceReport) -> str:
        o = self.options
        return ConsoleRenderer(width=o.width or 120, color=o.color,
                               block_size_bytes=o.block_size_bytes).render(record.run, record.verdict)


class TraceReportJson(Renderer):
    """The run's JSON document plus "verdict"."""

    record_type, format, file_extension = TraceReport, "json", "json"

    def render(self, record: TraceReport) -> str:
        return JsonRenderer(self.options.block_size_bytes).render_report(record)


class SweepConsole(Renderer):
    record_type, format, file_extension = SweepOutcome, "console", "txt"

    def render(self, record: SweepOutcome) -> str:
        return render_sweep(record, self.options.width or 130)


class SweepJson(Renderer):
    record_type, format, file_extension = SweepOutcome, "json", "json"

    def render(self, record: SweepOutcome) -> str:
        return sweep_json(record)


class LayoutsConsole(Renderer):
    record_type, format, file_extension = LayoutSweep, "console", "txt"

    def render(self, record: LayoutSweep) -> str:
        return render_layouts(record, self.options.width or 130)


class LayoutsJson(Renderer):
    record_type, format, file_extension = LayoutSweep, "json", "json"

    def render(self, record: LayoutSweep) -> str:
        return layouts_json(record)


class CompareConsole(Renderer):
    record_type, format, file_extension = Comparison, "console", "txt"

    def render(self, record: Comparison) -> str:
        return render_compare(list(record.rows), self.options.width or 140)


class CompareJson(Renderer):
    record_type, format, file_extension = Comparison, "json", "json"

    def render(self, record: Comparison) -> str:
        return compare_json(list(record.rows))


class PlanConsole(Renderer):
    record_type, format, file_extension = PlanReport, "console", "txt"

    def render(self, record: PlanReport) -> str:
        text = render_plan(record.plan, self.options.width or 110) + render_endurance(record.endurance)
        return text + (render_check(list(record.check), self.options.width or 110) if record.check is not None else "")


class PlanJson(Renderer):
    record_type, format, file_extension = PlanReport, "json", "json"

    def render(self, record: PlanReport) -> str:
        return plan_json(record.plan, list(record.check) if record.check is not None else None, record.endurance)


class DoctorConsole(Renderer):
    record_type, format, file_extension = DoctorReport, "console", "txt"

    def render(self, record: DoctorReport) -> str:
        return render_checks(list(record.checks), self.options.width or 120)


class DoctorJson(Renderer):
    record_type, format, file_extension = DoctorReport, "json", "json"

    def render(self, record: DoctorReport) -> str:
        return doctor_json(list(record.checks))


RENDERERS: dict[tuple[type, str], type[Renderer]] = {
    (cls.record_type, cls.format): cls
    for cls in (TraceConsole, TraceJson, SweepConsole, SweepJson, LayoutsConsole, LayoutsJson, CompareConsole,
                CompareJson, PlanConsole, PlanJson, LintReportConsole, LintReportJson, DoctorConsole, DoctorJson)
}
RENDERERS.update({(cls.record_type, cls.format): cls for cls in HTML_RENDERERS})
RENDERERS.update({(cls.record_type, cls.format): cls for cls in (TraceReportConsole, TraceReportJson)})
RENDERERS.update({(cls.record_type, cls.format): cls for cls in (FleetConsole, FleetJson, FleetHtml)})
RENDERERS.update({(cls.record_type, cls.format): cls for cls in (FleetSweepConsole, FleetSweepJson)})
RENDERERS.update({(cls.record_type, cls.format): cls for cls in (OffloadConsole, OffloadJson)})


def formats_of(record_type: type) -> list[str]:
    return [fmt for (rt, fmt) in RENDERERS if rt is record_type]


def render(record: Any, fmt: str = "console", options: RenderOptions | None = None) -> str:
    """`record` in format `fmt`."""
    cls = RENDERERS.get((type(record), fmt))
    if cls is None:
        raise UsageError(f"no {fmt} output for {type(record).__name__}: choose "
                         f"{' or '.join(formats_of(type(record))) or 'another command'}")
    return cls(options).render(record)
