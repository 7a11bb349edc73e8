"""The report of a multi-node run (analysis.fleet.fleet_report builds it;
render/ prints it): per-node and per-rank rows, the slowest node of each
step, the straggler, the aggregate bandwidth and the verdict in words.

Step times are durations on each node's own clock; step numbers
(engine.global_steps) join the nodes. Bytes are block-layer bytes on the
node's top-level traced devices unless named swap (DeepSpeed's swapper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fleet import FleetRun
from .record import JsonRecord

FLEET_REPORT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FleetNodeRow(JsonRecord):
    """One node: medians over its steady steps (None: no steps, or no run)."""

    host: str
    status: str                          # ok | failed | lost
    error: str
    ranks: tuple[int, ...]
    steps: int                           # training steps recorded (lowest rank on the node)
    step_s: float | None
    optimizer_s: float | None
    read_bytes_per_step: float | None
    write_bytes_per_step: float | None
    swap_bytes_per_step: float | None    # DeepSpeed swap bytes (read + write) per steady step
    block_bytes: int | None              # read + write over the whole run
    duration_s: float | None
    busy_bytes_per_s: float | None       # the node's devices' bandwidth while busy
    limit: str | None                    # the node's verdict (Verdict.limit)
    verdict: str | None                  # its summary line

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["ranks"] = list(self.ranks)
        return out


@dataclass(frozen=True)
class FleetRankRow(JsonRecord):
    """One rank: medians over its steady steps."""

    host: str
    rank: int
    steps: int
    step_s: float | None
    optimizer_s: float | None
    swap_bytes_per_step: float | None


@dataclass(frozen=True)
class StepStraggler(JsonRecord):
    """One global step recorded on two or more ok nodes: its slowest node."""

    step: int
    nodes: int                    # ok nodes that recorded the step
    host: str                     # the slowest
    step_s: float                 # its step time
    others_s: float               # the median step time of the other nodes
    gap_s: float                  # step_s - others_s (basis storage: stall_s - others_stall_s)
    gap_pct: float | None         # gap_s / others_s, in percent (basis storage: of step_s) (None: divisor 0)
    basis: str = "step"           # step: by step time | storage: by drive-busy time (equal step times)
    stall_s: float | None = None          # basis storage: its drives' busy time inside the step
    others_stall_s: float | None = None   # basis storage: the median of the other nodes'


@dataclass(frozen=True)
class StragglerSummary(JsonRecord):
    """The node that is slowest most often, against the other ok nodes."""

    host: str
    slowest_steps: int            # steps in which it was slowest
    compared_steps: int           # steps recorded on two or more nodes
    median_gap_s: float           # median gap of the slowest node, over the compared steps
    median_gap_pct: float | None
    step_s: float | None          # its median steady step
    others_step_s: float | None   # median of the other ok nodes' median steady steps
    busy_bytes_per_s: float | None
    others_busy_bytes_per_s: float | None
    stands_out: bool              # its steps (or its drives' busy time) longer than the others' beyond the noise
    basis: str = "step"           # step | storage, as most of its StepStragglers
    stall_s: float | None = None          # basis storage: median drive-busy time per step
    others_stall_s: float | None = None


@dataclass(frozen=True)
class FleetReport:
    fleet: FleetRun
    nodes: tuple[FleetNodeRow, ...]
    ranks: tuple[FleetRankRow, ...]
    steps: tuple[StepStraggler, ...]
    straggler: StragglerSummary | None
    wall_s: float                 # the fleet's wall time (its own, else the longest ok node's run)
    block_bytes: int              # read + write over the ok nodes
    aggregate_bytes_per_s: float  # block_bytes / wall_s
    summary: str                  # the verdict in words
    schema: int = FLEET_REPORT_SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        f = self.fleet
        return {
            "schema": self.schema, "kind": "fleet-report", "command": list(f.command),
            "transport": f.transport, "started_at": f.started_at, "wall_s": self.wall_s,
            "block_bytes": self.block_bytes, "aggregate_bytes_per_s": self.aggregate_bytes_per_s,
            "summary": self.summary,
            "straggler": self.straggler.to_json() if self.straggler is not None else None,
            "nodes": [n.to_json() for n in self.nodes], "ranks": [r.to_json() for r in self.ranks],
            "steps": [s.to_json() for s in self.steps],
        }
