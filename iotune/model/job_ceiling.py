"""The job-pattern ceiling of a traced run, as the run keeps it.

`iotune report RUN --ceiling` (and `trace --ceiling`) replays the run's swap
schedule without its compute on the drive holding its swap directory
(iotune.sweep.replay.job_ceiling) and saves what it measured in the run, so
a later `iotune report RUN` judges the run against it again without the
drive. A re-measure (the run was measured faster than the first ceiling's
top) keeps the first measurement in `earlier`.

Pure: stdlib and iotune.model only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import units
from .replay_result import JobCeiling


@dataclass(frozen=True)
class MeasuredJobCeiling:
    """A JobCeiling measured for one traced device of a run."""

    device: str                  # as in TraceRun.devices[].name
    directory: str               # where the replay ran (the swap directory, or the nearest existing parent)
    ceiling: JobCeiling
    measured_at: str = ""        # ISO 8601, UTC
    earlier: tuple[JobCeiling, ...] = ()     # measurements a re-measure replaced, oldest first

    @property
    def attempts(self) -> int:
        return len(self.earlier) + 1

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "directory": self.directory, "ceiling": self.ceiling.to_json(),
                "measured_at": self.measured_at, "earlier": [c.to_json() for c in self.earlier]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MeasuredJobCeiling:
        return cls(str(data["device"]), str(data.get("directory", "")), JobCeiling.from_json(data["ceiling"]),
                   str(data.get("measured_at", "")),
                   tuple(JobCeiling.from_json(c) for c in data.get("earlier") or ()))


def job_pattern_label(c: JobCeiling) -> str:
    """How a report names a job-pattern ceiling: "this job's swap pattern replayed, 41.5 MB/s (41.3–41.8, 3 runs)"."""
    return (f"this job's swap pattern replayed, {units.mb_s(c.bytes_per_s)} ({units.rate(c.min_bytes_per_s)}–"
            f"{units.rate(c.max_bytes_per_s)}, {c.count} runs)")
