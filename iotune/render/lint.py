"""`iotune lint`'s output."""

from __future__ import annotations

import json

from ..model.lint import LintFinding


def render_findings(path: str, findings: list[LintFinding]) -> str:
    if not findings:
        return f"{path}: no problems found\n"
    lines = []
    for f in findings:
        lines.append(f"{path}: {f.severity}: {f.where}: {f.message} [{f.rule}]")
        lines.append(f"    fix: {f.fix}")
    errors = sum(f.severity == "error" for f in findings)
    lines.append(f"{errors} error(s), {len(findings) - errors} warning(s)")
    return "\n".join(lines) + "\n"


def findings_json(path: str, findings: list[LintFinding]) -> str:
    return json.dumps({"config": path, "findings": [f.to_json() for f in findings]}, indent=1) + "\n"
