"""`iotune lint`'s output: findings (or why the file could not be linted) as
console text or one JSON document."""

from __future__ import annotations

import json
from typing import Any

from ..model.reports import LintReport
from .base import Renderer


def render_lint(report: LintReport) -> str:
    path = report.config
    if report.error is not None:
        return f"{path}: cannot lint: {report.error.message}\n"
    lines = []
    for f in report.findings:
        lines.append(f"{path}: {f.severity}: {f.where}: {f.message} [{f.rule}]")
        lines.append(f"    fix: {f.fix}")
    if not report.findings:
        lines.append(f"{path}: no problems found")
    else:
        lines.append(f"{report.errors} error(s), {report.warnings} warning(s)")
    return "\n".join(lines) + "\n"


def lint_json(report: LintReport) -> str:
    return json.dumps(report.to_json(), indent=1) + "\n"


class LintReportConsole(Renderer):
    record_type, format, file_extension = LintReport, "console", "txt"

    def render(self, record: Any) -> str:
        return render_lint(record)


class LintReportJson(Renderer):
    record_type, format, file_extension = LintReport, "json", "json"

    def render(self, record: Any) -> str:
        return lint_json(record)
