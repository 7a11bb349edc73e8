"""Side-by-side figures of several runs (e.g. nvme-opt vs zenflow vs cpu)."""

from __future__ import annotations

from ..model.reports import Comparison, CompareRow
from ..model.run import TraceRun
from .attribution import median_step, step_breakdowns
from .summary import dominant_size, totals


def label_of(run: TraceRun, fallback: str) -> str:
    """`--strategy X` from the traced command line, else the fallback."""
    cmd = list(run.command)
    for i, arg in enumerate(cmd):
        if arg == "--strategy" and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith("--strategy="):
            return arg.split("=", 1)[1]
    return fallback


def compare_row(run: TraceRun, label: str) -> CompareRow:
    rows = step_breakdowns(run)
    med = median_step(rows)
    t = totals(run)
    sizes = [dominant_size(d) for d in run.devices if not d.is_lower]
    moved = t.read_bytes + t.write_bytes
    return CompareRow(
        label=label, steps=len(rows), step_s=med.total_s if med else None,
        optimizer_s=med.optimizer_s if med else None,
        read_bytes_per_step=med.read_bytes if med else None, write_bytes_per_step=med.write_bytes if med else None,
        swap_bytes_per_step=med.swap_read_bytes + med.swap_write_bytes if med else None,
        dominant_size_bytes=max((s for s in sizes if s), default=None),
        bytes_per_s=moved / run.duration_s if run.duration_s > 0 else 0.0, total_bytes=moved,
    )


def compare_runs(runs: list[tuple[TraceRun, str]]) -> Comparison:
    """(run, fallback label) pairs -> the comparison, first run as reference."""
    return Comparison(tuple(compare_row(run, label_of(run, name)) for run, name in runs),
                      tuple(run for run, _ in runs))
