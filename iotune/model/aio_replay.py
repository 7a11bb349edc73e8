"""The aio sweep's ranking on the replay of the job's own swap I/O: which
swap schedule it replayed (recorded from the first real run at DeepSpeed's
defaults), whether the replay reproduced that run's step (fidelity), each
finalist's replays against the defaults' in alternating pairs, and the
replay's pick, the one candidate real steps then confirm. When the replay
cannot rank (no schedule, poor fidelity, every replay failed) `fallback`
says why, and the finalists run on real steps as without a replay.

Seconds are one replay of the traced step's optimizer phase with the job's
compute slept where it ran; a ratio is the defaults' seconds over the
candidate's (above 1: the candidate is faster). Pure: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import units
from .record import JsonRecord, from_fields
from .replay import SwapSchedule
from .replay_result import Fidelity
from .sweep import SweepPoint

NOT_RANKED = "so candidates run on real steps"


@dataclass(frozen=True)
class RecordedSchedule(JsonRecord):
    """What the swap schedule a sweep recorded (kept whole in the recording trial's journal
    record) holds."""

    step: int                  # the traced step it is the schedule of
    traced_s: float            # that step's traced time (what fidelity compares with)
    read_bytes: int
    write_bytes: int
    groups: int                # waits in the step

    @classmethod
    def of(cls, schedule: SwapSchedule) -> RecordedSchedule:
        return cls(schedule.step, schedule.traced_s, schedule.read_bytes, schedule.write_bytes,
                   len(schedule.groups))

    def describe(self) -> str:
        return (f"step {self.step}: {units.mb(self.read_bytes)} MB read and {units.mb(self.write_bytes)} MB "
                f"written in {self.groups} waits, traced {self.traced_s:.3f} s")


@dataclass(frozen=True)
class ReplayRow(JsonRecord):
    """One point's replays: its seconds, and against the defaults' (the rule's verdict on its pairs)."""

    point: SweepPoint
    seconds: float             # median of its replays
    spread: float              # (max - min) / median over its replays, 0 for one
    runs: int                  # replays (each moved every byte)
    ratio: float = 1.0         # the geometric mean of its pairs' ratios (1: the defaults themselves)
    lower: float = 0.0         # the rule's interval on the ratio (0, 0: none yet)
    upper: float = 0.0
    pairs: int = 0
    verdict: str = ""          # faster | within noise | slower | undecided ("": the defaults themselves)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "point": self.point.to_json(), "key": self.point.key()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayRow:
        return from_fields(cls, {**data, "point": SweepPoint.from_json(data["point"])})


@dataclass(frozen=True)
class ReplayRanking:
    """The replay stage of one aio sweep (see the module docstring)."""

    schedule: RecordedSchedule | None = None
    fidelity: Fidelity | None = None
    rows: tuple[ReplayRow, ...] = ()       # fastest first; DeepSpeed's defaults among them
    pick: SweepPoint | None = None         # faster than the defaults on the replay (None: none was)
    fallback: str = ""                     # why the candidates ran on real steps instead ("": ranked here)
    max_pairs: int = 0                     # the most replay pairs per candidate

    @property
    def ranked(self) -> bool:
        """The candidates were ranked on the replay (not on real steps)."""
        return not self.fallback and bool(self.rows)

    def fidelity_line(self) -> str:
        """The fidelity check in words ("" without one)."""
        f = self.fidelity
        if f is None:
            return ""
        took = (f"the replay of your config took {f.replay_s:.3f} s against the traced {f.traced_s:.3f} s: "
                f"off by {100 * abs(f.ratio - 1):.1f} %")
        if not f.can_rank:
            return f"{took}, {NOT_RANKED}"
        return (f"{took}, within {100 * f.tolerance:.0f} %, so candidates are ranked on the replay of your job's own "
                f"swap I/O")

    def pick_line(self) -> str:
        """What the ranking decided, in words ("" when it did not rank)."""
        if not self.ranked:
            return ""
        if self.pick is None:
            return ("no candidate beat DeepSpeed's defaults on the replay of your job's own swap I/O, so no real "
                    "steps were needed: DeepSpeed's defaults are kept")
        p = self.pick
        row = next((r for r in self.rows if r.point.key() == p.key()), None)
        speed = f" ({row.ratio:.2f}× the defaults' speed, at least {row.lower:.2f}× by the rule)" if row else ""
        return (f"the replay's pick, {units.size(p.block_size)} blocks at queue depth {p.queue_depth} with "
                f"{p.intra_op_parallelism} thread{'s' if p.intra_op_parallelism != 1 else ''}{speed}, runs real steps "
                f"against DeepSpeed's defaults to confirm it")

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule.to_json() if self.schedule else None,
                "fidelity": self.fidelity.to_json() if self.fidelity else None,
                "rows": [r.to_json() for r in self.rows], "pick": self.pick.to_json() if self.pick else None,
                "fallback": self.fallback, "max_pairs": self.max_pairs, "ranked": self.ranked}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayRanking:
        sched, fid, pick = data.get("schedule"), data.get("fidelity"), data.get("pick")
        return cls(RecordedSchedule.from_json(sched) if sched else None, Fidelity.from_json(fid) if fid else None,
                   tuple(ReplayRow.from_json(r) for r in data.get("rows") or ()),
                   SweepPoint.from_json(pick) if pick else None, str(data.get("fallback", "")),
                   int(data.get("max_pairs", 0)))
