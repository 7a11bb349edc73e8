"""The HTML renderers: one per record type, each a report module's page
(html_trace, html_sweep) written out by the page shell (render/page.py,
where the choice of plotly is explained)."""

from __future__ import annotations

from ..model.reports import Comparison
from ..model.sweep_result import LayoutSweep, SweepOutcome
from ..model.verdict import TraceReport
from .base import RenderOptions
from .html_sweep import compare_page, layouts_page, sweep_page
from .html_trace import trace_page


def trace_html(report: TraceReport, opts: RenderOptions) -> str:
    return trace_page(report).html()


def sweep_html(o: SweepOutcome, opts: RenderOptions) -> str:
    return sweep_page(o).html()


def layouts_html(ls: LayoutSweep, opts: RenderOptions) -> str:
    return layouts_page(ls).html()


def compare_html(c: Comparison, opts: RenderOptions) -> str:
    return compare_page(c).html()
