"""A trace run: what the block probes saw, per device and direction.

`TraceRun.to_json()` / `TraceRun.from_json()` round-trip; `from_json` loads
records written by older iotune versions (missing fields take defaults) and
refuses records from a newer schema with a message saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from ..errors import RecordError
from .record import known_fields

from .appio import AppLayer
from .attribution import Attribution
from .job_ceiling import MeasuredJobCeiling
from .replay import SwapSchedule

SCHEMA_VERSION = 1

# Index = OP_* in probes/blockio.h.
OPS: tuple[str, ...] = ("read", "write", "flush", "discard", "other")


def _int_keys(d: dict[str, Any] | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in (d or {}).items()}


def _str_keys(d: dict[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(d.items())}


@dataclass(frozen=True)
class DirectionStats:
    """Requests of one direction (read, write, flush, ...) on one device."""

    op: str
    requests: int = 0
    bytes: int = 0
    sequential: int = 0
    meta: int = 0
    completed: int = 0
    lat_sum_ns: int = 0
    errors: int = 0
    queued: int = 0              # issued after waiting in the OS queue (block_rq_insert seen)
    queue_sum_ns: int = 0        # their insert -> issue time
    sizes: dict[int, int] = field(default_factory=dict)       # size_bytes -> count
    size_log2: dict[int, int] = field(default_factory=dict)   # log2 slot -> count
    lat_slots: dict[int, int] = field(default_factory=dict)   # log-linear ns slot -> count
    queue_slots: dict[int, int] = field(default_factory=dict)  # insert -> issue, same slots
    depth: dict[int, int] = field(default_factory=dict)       # in-flight at issue -> count

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op, "requests": self.requests, "bytes": self.bytes,
            "sequential": self.sequential, "meta": self.meta,
            "completed": self.completed, "lat_sum_ns": self.lat_sum_ns,
            "errors": self.errors, "queued": self.queued, "queue_sum_ns": self.queue_sum_ns,
            "sizes": _str_keys(self.sizes), "size_log2": _str_keys(self.size_log2),
            "lat_slots": _str_keys(self.lat_slots), "queue_slots": _str_keys(self.queue_slots),
            "depth": _str_keys(self.depth),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DirectionStats:
        d = known_fields(cls, data)
        for key in ("sizes", "size_log2", "lat_slots", "queue_slots", "depth"):
            d[key] = _int_keys(d.get(key))
        return cls(**d)


@dataclass(frozen=True)
class DeviceStats:
    """One block device. `lower_of` names the traced devices whose I/O this
    device carries again (a loop device's backing disk, an md member): such a
    device is reported but left out of totals, so nothing is counted twice."""

    major: int
    minor: int
    name: str
    directions: dict[str, DirectionStats] = field(default_factory=dict)
    lower_of: tuple[str, ...] = ()
    description: str = ""
    size_bytes: int = 0            # capacity when the trace recorded it (0: unknown, older runs)
    max_sectors_kb: int = 0        # queue limits when the trace ran (0: unknown, older runs)
    max_segments: int = 0
    max_segment_size: int = 0      # bytes

    @property
    def is_lower(self) -> bool:
        return bool(self.lower_of)

    def direction(self, op: str) -> DirectionStats:
        return self.directions.get(op) or DirectionStats(op=op)

    def to_json(self) -> dict[str, Any]:
        return {
            "major": self.major, "minor": self.minor, "name": self.name,
            "description": self.description, "lower_of": list(self.lower_of), "size_bytes": self.size_bytes,
            "max_sectors_kb": self.max_sectors_kb, "max_segments": self.max_segments,
            "max_segment_size": self.max_segment_size,
            "directions": {op: s.to_json() for op, s in self.directions.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceStats:
        d = known_fields(cls, data)
        d["lower_of"] = tuple(d.get("lower_of", ()))
        d["directions"] = {
            op: DirectionStats.from_json(s) for op, s in d.get("directions", {}).items()
        }
        return cls(**d)


class TimelinePoint(NamedTuple):
    """Requests and bytes issued on one device in one interval.

    A named tuple, not a dataclass: a day-long trace holds over a million of
    them, and a tuple is built in C (`tuple.__new__`), without a Python
    __init__ per point (runfile's loader depends on this)."""

    t_s: float      # start of the interval, seconds since the trace began
    device: str
    op: str
    requests: int
    bytes: int


@dataclass(frozen=True)
class HostInfo:
    kernel: str = ""
    hostname: str = ""
    iotune_version: str = ""
    bcc_version: str = ""


@dataclass(frozen=True)
class TraceRun:
    """Everything one `iotune trace` collected."""

    run_id: str
    started_at: str                  # ISO 8601, UTC
    duration_s: float
    interval_s: float = 1.0
    command: tuple[str, ...] = ()    # empty for a --duration window
    exit_status: int | None = None   # the traced command's, shell-style (128+N for signal N)
    outcome: str = "completed"       # completed | failed | interrupted | window
    device_filter: tuple[str, ...] = ()   # empty: every device
    devices: tuple[DeviceStats, ...] = ()
    timeline: Sequence[TimelinePoint] = ()   # a tuple, or a columnar model.timeline.Timeline
    drops: dict[str, int] = field(default_factory=dict)
    host: HostInfo = field(default_factory=HostInfo)
    clock_origin_ns: int = 0         # CLOCK_MONOTONIC time of timeline t_s = 0
    attribution: Attribution | None = None   # from the injected hooks, if any
    app: AppLayer | None = None       # the application layer (probes/appio.c), if traced
    swap_schedule: SwapSchedule | None = None     # one steady step's swap I/O (from the hooks), if it had one
    job_ceiling: MeasuredJobCeiling | None = None  # the schedule replayed without compute (--ceiling), if measured
    schema: int = SCHEMA_VERSION

    def device(self, name: str) -> DeviceStats | None:
        return next((d for d in self.devices if d.name == name), None)

    def with_timeline(self, timeline: Sequence[TimelinePoint]) -> TraceRun:
        return replace(self, timeline=timeline)

    def to_json(self, include_timeline: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema, "run_id": self.run_id,
            "started_at": self.started_at, "duration_s": self.duration_s,
            "interval_s": self.interval_s, "command": list(self.command),
            "exit_status": self.exit_status, "outcome": self.outcome,
            "device_filter": list(self.device_filter),
            "devices": [d.to_json() for d in self.devices],
            "drops": dict(self.drops), "host": vars(self.host).copy(),
            "clock_origin_ns": self.clock_origin_ns,
            "attribution": self.attribution.to_json() if self.attribution else None,
            "app": self.app.to_json() if self.app else None,
            "swap_schedule": self.swap_schedule.to_json() if self.swap_schedule else None,
            "job_ceiling": self.job_ceiling.to_json() if self.job_ceiling else None,
        }
        if include_timeline:
            out["timeline"] = [p._asdict() for p in self.timeline]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TraceRun:
        if not isinstance(data, dict):
            raise RecordError("not a trace record: expected a JSON object")
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or schema > SCHEMA_VERSION:
            raise RecordError(
                f"record schema {schema} is newer than this iotune understands "
                f"({SCHEMA_VERSION}); upgrade iotune to read it"
            )
        missing = [k for k in ("run_id", "started_at", "duration_s") if k not in data]
        if missing:
            raise RecordError(f"not a trace record: missing {', '.join(missing)}")
        d = known_fields(cls, data)
        d["schema"] = SCHEMA_VERSION
        d["command"] = tuple(d.get("command", ()))
        d["device_filter"] = tuple(d.get("device_filter", ()))
        d["devices"] = tuple(DeviceStats.from_json(x) for x in d.get("devices", ()))
        d["timeline"] = tuple(
            TimelinePoint(**{k: v for k, v in p.items() if k in TimelinePoint._fields})
            for p in d.get("timeline", ())
        )
        d["host"] = HostInfo(**known_fields(HostInfo, d.get("host") or {}))
        d["drops"] = {str(k): int(v) for k, v in (d.get("drops") or {}).items()}
        d["attribution"] = Attribution.from_json(d["attribution"]) if d.get("attribution") else None
        d["app"] = AppLayer.from_json(d["app"]) if d.get("app") else None
        d["swap_schedule"] = SwapSchedule.from_json(d["swap_schedule"]) if d.get("swap_schedule") else None
        d["job_ceiling"] = MeasuredJobCeiling.from_json(d["job_ceiling"]) if d.get("job_ceiling") else None
        return cls(**d)
