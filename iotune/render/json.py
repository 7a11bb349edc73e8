"""Machine output: the run record plus derived summaries, as real JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

from ..analysis.layers import app_rows, category_bytes, layer_rows, no_block_statements
from ..analysis.summary import patterns, summarize, totals
from ..model.run import TraceRun
from ..model.verdict import TraceReport


class JsonRenderer:
    file_extension = "json"

    def __init__(self, block_size_bytes: int | None = None) -> None:
        self.block_size_bytes = block_size_bytes

    def render(self, run: TraceRun) -> str:
        return json.dumps(self.document(run), indent=1, allow_nan=False) + "\n"

    def render_report(self, report: TraceReport) -> str:
        """The run's document plus "verdict" (null when none was made)."""
        doc = self.document(report.run)
        doc["verdict"] = report.verdict.to_json() if report.verdict is not None else None
        return json.dumps(doc, indent=1, allow_nan=False) + "\n"

    def document(self, run: TraceRun) -> dict[str, object]:
        return {
            "run": run.to_json(),
            "summary": [asdict(s) for s in summarize(run)],
            "totals": asdict(totals(run)),
            "patterns": [asdict(p) for p in patterns(run, self.block_size_bytes)],
            "layers": None if run.app is None else {
                "app": [asdict(r) for r in app_rows(run.app)],
                "both": [asdict(r) for r in layer_rows(run)],
                "categories": [asdict(r) for r in category_bytes(run.app)],
                "statements": no_block_statements(run.app),
            },
        }

