"""The verdict at the top of a trace report: the summary line, then one
line per finding (its rule is in the JSON output and docs/guide/report.md)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from ..model.verdict import KINDS, Verdict

LABELS = {"stall": "stall", "distance": "device", "limit": "limit", "advice": "to do", "endurance": "wear",
          "note": "note"}


def verdict_section(v: Verdict | None) -> RenderableType:
    if v is None:
        return Text("")
    t = Text()
    t.append("Verdict: ", style="bold")
    t.append(v.summary + "\n", style="bold")
    order = {k: i for i, k in enumerate(KINDS)}
    for f in sorted(v.findings, key=lambda f: order.get(f.kind, len(KINDS))):
        t.append(f"  {LABELS.get(f.kind, f.kind):>6}  ", style="italic")
        t.append(f.headline + "\n")
    t.append("  (the rule behind each line: iotune report RUN --json, or \"The verdict\" in docs/guide/report.md)\n", style="dim")
    return t
