"""`iotune doctor`'s table."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table

from ..model.reports import DoctorReport
from .base import RenderOptions

MARK = {"ok": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip"}


def doctor_console(report: DoctorReport, opts: RenderOptions) -> str:
    table = Table(show_edge=False, pad_edge=False)
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for r in report.checks:
        fix = r.fix + (" (iotune doctor --fix)" if r.fixable and r.status in ("fail", "warn") else "")
        table.add_row(r.name, MARK.get(r.status, r.status), r.detail, fix if r.status != "ok" else "")
    buf = io.StringIO()
    Console(file=buf, width=opts.width or 120, color_system=None).print(table)
    failed = sum(r.status == "fail" for r in report.checks)
    buf.write("all prerequisites met\n" if not failed else f"{failed} check(s) failed: apply the fixes above\n")
    return buf.getvalue()


def doctor_json(report: DoctorReport, opts: RenderOptions) -> str:
    return json.dumps([r.to_json() for r in report.checks], indent=1) + "\n"
