"""The HTML renderers: one per record type, each a report module's page
(html_trace, html_sweep) written out by the page shell (render/page.py,
where the choice of plotly is explained)."""

from __future__ import annotations

from ..model.reports import Comparison
from ..model.sweep_result import LayoutSweep, SweepOutcome
from ..model.verdict import TraceReport
from .base import Renderer
from .html_sweep import compare_page, layouts_page, sweep_page
from .html_trace import trace_page


class TraceHtml(Renderer):
    record_type, format, file_extension = TraceReport, "html", "html"

    def render(self, record: TraceReport) -> str:
        return trace_page(record).html()


class SweepHtml(Renderer):
    record_type, format, file_extension = SweepOutcome, "html", "html"

    def render(self, record: SweepOutcome) -> str:
        return sweep_page(record).html()


class LayoutsHtml(Renderer):
    record_type, format, file_extension = LayoutSweep, "html", "html"

    def render(self, record: LayoutSweep) -> str:
        return layouts_page(record).html()


class CompareHtml(Renderer):
    record_type, format, file_extension = Comparison, "html", "html"

    def render(self, record: Comparison) -> str:
        return compare_page(record).html()


HTML_RENDERERS: tuple[type[Renderer], ...] = (TraceHtml, SweepHtml, LayoutsHtml, CompareHtml)
