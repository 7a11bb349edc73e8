"""Machine output: the run record plus derived summaries, as real JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import cast

import numpy as np

from ..analysis.checkpoints import CheckpointRow, checkpoint_rows
from ..analysis.layers import app_rows, category_bytes, layer_rows, no_block_statements
from ..analysis.summary import patterns, summarize, totals
from ..model.run import TimelinePoint, TraceRun
from ..model.timeline import as_timeline
from ..model.verdict import TraceReport
from .base import RenderOptions


def run_json(run: TraceRun, opts: RenderOptions) -> str:
    return _dumps(run_document(run, opts.block_size_bytes, include_timeline=False), run)


def trace_json(report: TraceReport, opts: RenderOptions) -> str:
    """The run's JSON document plus "verdict" (null when none was made)."""
    doc = run_document(report.run, opts.block_size_bytes, include_timeline=False)
    doc["verdict"] = report.verdict.to_json() if report.verdict is not None else None
    return _dumps(doc, report.run)


def run_document(run: TraceRun, block_size_bytes: int | None = None, include_timeline: bool = True
                 ) -> dict[str, object]:
    """The run record plus its summaries, as plain JSON data."""
    return {
        "run": run.to_json(include_timeline),
        "summary": [asdict(s) for s in summarize(run)],
        "totals": asdict(totals(run)),
        "patterns": [asdict(p) for p in patterns(run, block_size_bytes)],
        "layers": None if run.app is None else {
            "app": [asdict(r) for r in app_rows(run.app)],
            "both": [asdict(r) for r in layer_rows(run)],
            "categories": [asdict(r) for r in category_bytes(run.app)],
            "statements": no_block_statements(run.app),
        },
        "checkpoints": [_checkpoint_json(r) for r in checkpoint_rows(run, rank=None)],
    }


def _checkpoint_json(r: CheckpointRow) -> dict[str, object]:
    doc = asdict(r)
    doc["bytes_per_s"], doc["durable_bytes_per_s"] = r.bytes_per_s, r.durable_bytes_per_s
    return doc


# Where the timeline goes in the indented document: a string no other value can
# hold (argv and device names cannot contain NUL).
_TIMELINE_SLOT = "\0iotune timeline\0"


def _dumps(doc: dict[str, object], run: TraceRun) -> str:
    """The document indented, its timeline one compact point per line.

    A day-long run has over a million timeline points; json's indenting
    encoder is pure Python (11 s for such a run, 160 MB), while the points
    written from the timeline's columns take about a second. Same JSON."""
    cast(dict[str, object], doc["run"])["timeline"] = _TIMELINE_SLOT   # document() made it a dict
    text = json.dumps(doc, indent=1, allow_nan=False)
    return text.replace(json.dumps(_TIMELINE_SLOT), timeline_json(run.timeline, depth=2), 1) + "\n"


def timeline_json(points: Sequence[TimelinePoint], depth: int = 0) -> str:
    """The timeline as a JSON array of {t_s, device, op, requests, bytes}
    objects, one per line, the array indented one space per level as if at
    `depth` in a document dumped with indent=1."""
    if not len(points):
        return "[]"
    tl = as_timeline(points)
    if not np.isfinite(tl.t_s).all():
        raise ValueError("Out of range float values are not JSON compliant (a timeline t_s is NaN or infinite)")
    devices = [json.dumps(d) for d in tl.devices]
    ops = [json.dumps(o) for o in tl.ops]
    pad = " " * (depth + 1)
    lines = [f'{pad}{{"t_s": {t!r}, "device": {devices[d]}, "op": {ops[o]}, "requests": {r}, "bytes": {b}}}'
             for t, d, o, r, b in zip(tl.t_s.tolist(), tl.device_code.tolist(), tl.op_code.tolist(),
                                      tl.requests.tolist(), tl.bytes.tolist())]
    return "[\n" + ",\n".join(lines) + "\n" + " " * depth + "]"
