"""`iotune plan --check RUN`: the model's per-step bytes against a trace."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.plan import Plan
from ..model.run import TraceRun
from .attribution import median_step, step_breakdowns, swap_by_category

BLOCK_LEVEL = "block level (all)"       # the category of the block-level rows


@dataclass(frozen=True)
class CheckRow:
    category: str
    direction: str
    predicted_bytes: float
    measured_bytes: float

    @property
    def error_pct(self) -> float | None:
        if self.measured_bytes == 0:
            return None if self.predicted_bytes == 0 else float("inf")
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


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
