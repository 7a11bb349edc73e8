"""`iotune lint`'s output: findings (or why the file could not be linted) as
console text or one JSON document."""

from __future__ import annotations

import json

from ..model.reports import LintReport
from .base import RenderOptions


def lint_console(report: LintReport, opts: RenderOptions) -> str:
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


def lint_json(report: LintReport, opts: RenderOptions) -> str:
    return json.dumps(report.to_json(), indent=1) + "\n"
