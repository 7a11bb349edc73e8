"""`iotune plan --check RUN`: the model's per-step bytes against a trace."""

from __future__ import annotations

from ..model.plan import Plan
from ..model.reports import CheckRow
from ..model.run import TraceRun
from .attribution import median_step, step_breakdowns, swap_by_category

BLOCK_LEVEL = "block level (all)"       # the category of the block-level rows


def check(plan: Plan, run: TraceRun) -> list[CheckRow]:
    """Per category and direction: predicted vs measured swap bytes per
    optimizer step, then the block-level total on the traced devices (which
    also carries filesystem metadata the model does not predict)."""
    measured = {c.category: c for c in swap_by_category(run)}
    rows = []
    pred = plan.per_optimizer_step
    for cat in sorted(set(pred.read) | set(measured)):
        m = measured.get(cat)
        rows.append(CheckRow(cat, "read", pred.read.get(cat, 0.0), m.read_bytes_per_step if m else 0.0))
        rows.append(CheckRow(cat, "write", pred.write.get(cat, 0.0), m.write_bytes_per_step if m else 0.0))
    med = median_step(step_breakdowns(run))
    if med is not None:
        rows.append(CheckRow(BLOCK_LEVEL, "read", pred.total_read, med.read_bytes))
        rows.append(CheckRow(BLOCK_LEVEL, "write", pred.total_write, med.write_bytes))
    return rows
