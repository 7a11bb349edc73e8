"""Progress display for long work (on stderr, so stdout stays clean)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..model import units
from ..model.sweep import SweepPoint, Trial
from ..model.sweep_result import Progress as TrialProgress


@contextlib.contextmanager
def sweep_progress() -> Iterator[Callable[[TrialProgress], None]]:
    """A callback for sweep trials: a bar with ETA on a terminal, one line per
    trial otherwise."""
    console = Console(file=sys.stderr, highlight=False)
    if not console.is_terminal:
        def line(p: TrialProgress) -> None:
            t = p.trial
            what = "reused" if p.reused else ("failed: " + t.error if t.status != "ok" else _result(t))
            console.print(f"[{p.done}/{p.planned}] {t.executor} {_point(t.point)} rep {t.repeat}: {what}")
        yield line
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True)
    with bar:
        task = bar.add_task("sweep", total=None)

        def update(p: TrialProgress) -> None:
            bar.update(task, completed=p.done, total=p.planned,
                       description=f"{p.trial.executor} {_point(p.trial.point)}")
        yield update


def _point(p: SweepPoint) -> str:
    return f"bs={units.size(p.block_size)} qd={p.queue_depth} t={p.intra_op_parallelism}" + \
        (" ss" if p.single_submit else "") + ("" if p.overlap_events else " no-overlap")


def _result(t: Trial) -> str:
    m = t.measurement
    if m is None:
        return "-"
    if m.step_s:
        opt = "-" if m.optimizer_step_s is None else f"{m.optimizer_step_s:.3f} s"
        return f"step {m.step_s:.3f} s, optimizer {opt}"
    return f"read {units.rate(m.read_bytes_per_s)} MB/s, write {units.rate(m.write_bytes_per_s)} MB/s"
