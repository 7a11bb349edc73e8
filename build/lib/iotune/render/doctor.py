"""`iotune doctor`'s table."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table

from ..model.checks import CheckResult

MARK = {"ok": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip"}


def render_checks(results: list[CheckResult], width: int = 120) -> str:
    table = Table(show_edge=False, pad_edge=False)
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for r in results:
        fix = r.fix + (" (iotune doctor --fix)" if r.fixable and r.status in ("fail", "warn") else "")
        table.add_row(r.name, MARK.get(r.status, r.status), r.detail, fix if r.status != "ok" else "")
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(table)
    failed = sum(r.status == "fail" for r in results)
    buf.write("all prerequisites met\n" if not failed else f"{failed} check(s) failed: apply the fixes above\n")
    return buf.getvalue()


def doctor_json(results: list[CheckResult]) -> str:
    return json.dumps([r.to_json() for r in results], indent=1) + "\n"
