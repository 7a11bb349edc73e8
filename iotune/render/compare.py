"""`iotune compare`: runs side by side."""

from __future__ import annotations

import io
import json
from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from ..model import units
from ..model.reports import Comparison
from .base import RenderOptions


def compare_console(c: Comparison, opts: RenderOptions) -> str:
    table = Table(title="Runs side by side (medians over steady steps; GB = 10^9 bytes, MB/s decimal)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("run", "steps", "step time", "× first", "optimizer step", "GB read/step",
                "GB written/step", "swap GB/step", "dominant size", "MB/s (whole run)"):
        table.add_column(col, justify="left" if col == "run" else "right")
    base = c.rows[0].step_s if c.rows else None
    for r in c.rows:
        ratio = "-" if not base or r.step_s is None else f"{r.step_s / base:.2f}"
        table.add_row(r.label, str(r.steps), units.step_time(r.step_s), ratio, units.step_time(r.optimizer_s),
                      units.gb(r.read_bytes_per_step), units.gb(r.write_bytes_per_step),
                      units.gb(r.swap_bytes_per_step),
                      "-" if r.dominant_size_bytes is None else units.size(r.dominant_size_bytes),
                      units.rate(r.bytes_per_s))
    buf = io.StringIO()
    Console(file=buf, width=opts.width or 140, color_system=None).print(table)
    return buf.getvalue()


def compare_json(c: Comparison, opts: RenderOptions) -> str:
    return json.dumps([asdict(r) for r in c.rows], indent=1) + "\n"
