"""What a sweep produces: ranked points, the outcome of one sweep, progress
events, and the layout sweep's results. Plain data; the ranking logic that
fills these lives in sweep/."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .sweep import SweepPoint, Trial


@dataclass(frozen=True)
class Ranked:
    """One point's measurements over its repeats, by one executor."""

    point: SweepPoint
    executor: str
    scores: tuple[float, ...]          # one per successful repeat (bytes/s or 1/step_s)
    failed: int
    median: float
    spread: float                      # (max - min) / median over repeats, 0 for one repeat
    read_bytes_per_s: float
    write_bytes_per_s: float
    step_s: float | None = None
    optimizer_step_s: float | None = None

    @property
    def cost(self) -> tuple[int, int, int]:
        """Cheaper first: pinned staging memory, threads, queue depth."""
        p = self.point
        return (p.pinned_bytes(), p.intra_op_parallelism, p.queue_depth)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "point": self.point.to_json(), "key": self.point.key()}


@dataclass(frozen=True)
class SweepOutcome:
    """Everything a finished sweep reports."""

    target: str                                # the directory trials ran in
    profile: str
    executor: str                              # fio | aio
    ranking: list[Ranked]                      # the executor's ranking, best first
    confirmed: list[Ranked]                    # steps executor: candidates and the default
    recommended: SweepPoint | None
    default: Ranked | None                     # DeepSpeed's default aio settings, same executor
    ceiling_bytes_per_s: float | None          # the drive's limit (known, or measured)
    ceiling_source: str                        # "known limits" | "measured: ..."
    fragment: dict[str, object]                # DeepSpeed JSON to paste
    validation_error: str | None               # None: DeepSpeed accepted it
    trials: int
    trials_run_now: int
    failed: int
    journal: str
    confirm_error: str = ""                    # every training-step trial failed: the first reason
    threads: list[Ranked] = field(default_factory=list)   # the recommendation at each OMP_NUM_THREADS
    omp_threads_best: int = 0                  # the thread count to use (0: not measured)

    def recommended_row(self) -> Ranked | None:
        """The recommendation's row in the executor's ranking."""
        if self.recommended is None:
            return None
        key = self.recommended.key()
        return next((r for r in self.ranking if r.point.key() == key), None)


def gain(best: Ranked | None, default: Ranked | None) -> float | None:
    """best / default on the executor's score (bandwidth or 1/step time)."""
    if best is None or default is None or default.median <= 0:
        return None
    return best.median / default.median


@dataclass(frozen=True)
class Progress:
    """One trial done (or taken from the journal), for progress displays."""

    done: int
    planned: int
    trial: Trial
    reused: bool          # taken from the journal, not run now


@dataclass(frozen=True)
class LayoutResult:
    name: str
    drives: int
    backend: str
    reason: str
    outcome: SweepOutcome


@dataclass(frozen=True)
class Effects:
    layout: float      # best score of the best layout / best score of the worst layout
    aio: float         # largest best/worst ratio of aio settings within one layout

    @property
    def dominant(self) -> str:
        return "layout" if self.layout >= self.aio else "aio settings"


@dataclass(frozen=True)
class LayoutSweep:
    """`iotune sweep --layouts N`: every layout's sweep, and what mattered."""

    results: tuple[LayoutResult, ...]
    effects: Effects
