"""What a replay of a job's swap schedule measured (iotune.sweep.replay), and
what it is good for:

- fidelity(): whether the replay reproduces the traced step's time (then it
  can rank aio candidates in place of real steps, which vary by 9-14 % at
  1B and take minutes), or not (then callers measure real steps);
- the job-pattern ceiling: the schedule without its compute, replayed at
  several aio settings and repeated: the fastest this job's own pattern
  moves on this drive. A run measured faster than that is a measurement
  problem, caught by check_against_ceiling(); a fraction of the ceiling is
  shown capped at 1.

Rates are bytes/s of reads and writes together (decimal MB/s in sentences).
Pure: stdlib only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import IotuneError
from . import units
from .aio import AioSettings
from .replay import SwapSchedule

FIDELITY_TOLERANCE = 0.05        # a replay within 5 % of the traced step can rank candidates
MIN_CEILING_REPEATS = 3


@dataclass(frozen=True)
class WaitTiming:
    """One group of the schedule as replayed: the time blocked in wait(), the
    time from its first submit to the wait's end, the bytes its ops moved
    (theirs, or the kernel's count where it counted fewer: short I/O) and
    what the kernel counted (which may include a page of the filesystem's
    own metadata: more is not a shortfall)."""

    group: int
    wait_s: float
    io_s: float
    read_bytes: int
    write_bytes: int
    traced_wait_s: float | None = None     # the job's wait for the same group
    counted_read_bytes: int = 0
    counted_write_bytes: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WaitTiming:
        traced = data.get("traced_wait_s")
        return cls(int(data["group"]), float(data["wait_s"]), float(data.get("io_s", 0.0)),
                   int(data.get("read_bytes", 0)), int(data.get("write_bytes", 0)),
                   None if traced is None else float(traced), int(data.get("counted_read_bytes", 0)),
                   int(data.get("counted_write_bytes", 0)))


@dataclass(frozen=True)
class ReplayResult:
    """One replay of a schedule. read_bytes/write_bytes are what its ops
    moved, checked against what the kernel counted this process submitting
    to storage (/proc/self/io) after every wait; short_io names every group
    that moved less than its ops, and every read whose data was not what the
    files held (DeepSpeed's aio does not report a failed request)."""

    seconds: float
    read_bytes: int
    write_bytes: int
    expected_read_bytes: int
    expected_write_bytes: int
    waits: tuple[WaitTiming, ...]
    aio: AioSettings
    with_compute: bool                 # False: the schedule's compute was left out (a ceiling run)
    short_io: tuple[str, ...] = ()
    layout_s: float = 0.0              # laying out and syncing the files before timing (not in seconds)

    @property
    def complete(self) -> bool:
        """Every byte of the schedule moved, and no short I/O."""
        return (not self.short_io and self.read_bytes == self.expected_read_bytes
                and self.write_bytes == self.expected_write_bytes)

    @property
    def bytes_per_s(self) -> float:
        return (self.read_bytes + self.write_bytes) / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "waits": [asdict(w) for w in self.waits], "short_io": list(self.short_io),
                "aio": self.aio.to_ds_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayResult:
        return cls(float(data["seconds"]), int(data["read_bytes"]), int(data["write_bytes"]),
                   int(data.get("expected_read_bytes", data["read_bytes"])),
                   int(data.get("expected_write_bytes", data["write_bytes"])),
                   tuple(WaitTiming.from_json(w) for w in data.get("waits") or ()),
                   AioSettings.from_ds_json(dict(data.get("aio") or {})), bool(data.get("with_compute", True)),
                   tuple(str(s) for s in data.get("short_io") or ()), float(data.get("layout_s", 0.0)))


# --- fidelity -------------------------------------------------------------------


@dataclass(frozen=True)
class Fidelity:
    """How close a replay came to the traced step it replays."""

    replay_s: float
    traced_s: float
    tolerance: float = FIDELITY_TOLERANCE

    @property
    def ratio(self) -> float:
        return self.replay_s / self.traced_s if self.traced_s > 0 else float("inf")

    @property
    def can_rank(self) -> bool:
        """Within the tolerance: the replay may rank candidates in place of real steps."""
        return abs(self.ratio - 1.0) <= self.tolerance

    @property
    def sentence(self) -> str:
        both = (f"the replay took {self.replay_s:.3f} s against the traced step's {self.traced_s:.3f} s "
                f"(ratio {self.ratio:.3f})")
        if self.can_rank:
            return f"{both}: within {self.tolerance:.0%}, so the replay can rank candidates"
        return (f"{both}: more than {self.tolerance:.0%} apart, so the replay does not reproduce this job's "
                "step; rank candidates on real steps")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "can_rank": self.can_rank}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fidelity:
        return cls(float(data["replay_s"]), float(data["traced_s"]), float(data.get("tolerance", FIDELITY_TOLERANCE)))


def fidelity(schedule: SwapSchedule, replay: ReplayResult, tolerance: float = FIDELITY_TOLERANCE) -> Fidelity:
    """The replay's seconds against the traced step's (schedule.traced_s: the optimizer phase, from
    the step's first submit when it swapped before the phase)."""
    if not replay.with_compute:
        raise IotuneError("this replay left the job's compute out (a ceiling run), so it cannot be compared with "
                          "the traced step: replay the schedule itself (with_compute) for fidelity")
    if schedule.traced_s <= 0:
        raise IotuneError(f"the schedule of step {schedule.step} has no traced time: rebuild it from the hook's "
                          "events with swap_schedule()")
    return Fidelity(replay.seconds, schedule.traced_s, tolerance)


# --- the job-pattern ceiling ------------------------------------------------------------


@dataclass(frozen=True)
class SettingRuns:
    """Repeated replays of the schedule without compute at one aio setting."""

    aio: AioSettings
    bytes_per_s: tuple[float, ...]      # one per repeat, in order

    @property
    def median_bytes_per_s(self) -> float:
        return statistics.median(self.bytes_per_s) if self.bytes_per_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"aio": self.aio.to_ds_json(), "bytes_per_s": list(self.bytes_per_s)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SettingRuns:
        return cls(AioSettings.from_ds_json(dict(data.get("aio") or {})),
                   tuple(float(x) for x in data.get("bytes_per_s") or ()))


@dataclass(frozen=True)
class JobCeiling:
    """The fastest the job's own swap pattern moved on this drive: the best
    setting's median over its repeats, with their spread and count. It is
    the physical limit for this job's pattern, as a fio figure with another
    access pattern is not."""

    aio: AioSettings                     # the best setting
    bytes_per_s: float                   # its median
    min_bytes_per_s: float
    max_bytes_per_s: float
    count: int                           # its repeats
    settings: tuple[SettingRuns, ...]    # every setting tried, in order
    schedule_bytes: int = 0              # reads + writes of one replay
    step: int = 0                        # the traced step the schedule came from

    @property
    def sentence(self) -> str:
        return (f"{units.mb_s(self.bytes_per_s)} (median of {self.count} replays of step {self.step}'s swap I/O "
                f"without compute, {units.rate(self.min_bytes_per_s)}-{units.rate(self.max_bytes_per_s)} MB/s, "
                f"best of {len(self.settings)} aio settings)")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "aio": self.aio.to_ds_json(), "settings": [s.to_json() for s in self.settings]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobCeiling:
        return cls(AioSettings.from_ds_json(dict(data.get("aio") or {})), float(data["bytes_per_s"]),
                   float(data.get("min_bytes_per_s", data["bytes_per_s"])),
                   float(data.get("max_bytes_per_s", data["bytes_per_s"])), int(data.get("count", 0)),
                   tuple(SettingRuns.from_json(s) for s in data.get("settings") or ()),
                   int(data.get("schedule_bytes", 0)), int(data.get("step", 0)))


def ceiling_from_runs(runs: Sequence[SettingRuns], schedule: SwapSchedule) -> JobCeiling:
    """The best setting by median (the first of equals), with its spread."""
    if not runs or any(len(r.bytes_per_s) < MIN_CEILING_REPEATS for r in runs):
        raise IotuneError(f"a job-pattern ceiling needs at least {MIN_CEILING_REPEATS} replays at every setting "
                          "(a median and its spread): measure more repeats")
    best = max(runs, key=lambda r: r.median_bytes_per_s)
    return JobCeiling(best.aio, best.median_bytes_per_s, min(best.bytes_per_s), max(best.bytes_per_s),
                      len(best.bytes_per_s), tuple(runs), schedule.total_bytes, schedule.step)


def fraction_of_ceiling(measured_bytes_per_s: float, ceiling: JobCeiling) -> float:
    """measured / ceiling, never above 1: a faster run is a measurement to redo
    (check_against_ceiling says so), not a fraction to show."""
    if ceiling.bytes_per_s <= 0:
        return 0.0
    return min(1.0, max(0.0, measured_bytes_per_s / ceiling.bytes_per_s))


def check_against_ceiling(measured_bytes_per_s: float, ceiling: JobCeiling) -> str | None:
    """The warning for a run measured faster than the fastest replay of its own
    pattern (the top of the ceiling's spread); None when it is not."""
    if measured_bytes_per_s <= ceiling.max_bytes_per_s:
        return None
    return (f"measured faster than the ceiling: re-measure. The run moved {units.mb_s(measured_bytes_per_s)}, "
            f"above the ceiling of {ceiling.sentence}; the run and the ceiling were taken under different "
            "conditions (page cache, a throttle's burst, other I/O on the drive, a different step), so measure "
            "both again on the same drive")
