"""Machine output: the run record plus derived summaries, as real JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

from ..analysis.summary import patterns, summarize, totals
from ..model.run import TraceRun


class JsonRenderer:
    file_extension = "json"

    def __init__(self, block_size_bytes: int | None = None) -> None:
        self.block_size_bytes = block_size_bytes

    def render(self, run: TraceRun) -> str:
        doc = {
            "run": run.to_json(),
            "summary": [asdict(s) for s in summarize(run)],
            "totals": asdict(totals(run)),
            "patterns": [asdict(p) for p in patterns(run, self.block_size_bytes)],
        }
        return json.dumps(doc, indent=1, allow_nan=False) + "\n"

