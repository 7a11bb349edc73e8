"""A trace's timeline held as columns.

A day-long trace at 1 s intervals on 8 devices has 1.4 million timeline
points. As Python objects they take seconds to build and seconds more to
walk once per question (busy time, bytes, per-interval series). As columns
(one numpy array per field, device and op names coded as small integers)
they load from disk in milliseconds and every such question is one
vectorised pass. `Timeline` is still a sequence of `TimelinePoint`s for
code that wants points: it builds them on demand, and compares equal to a
tuple of the same points.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import count
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from .run import TimelinePoint

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Codes = npt.NDArray[np.int32]


class Timeline(Sequence[TimelinePoint]):
    """Timeline points as columns: t_s, device, op, requests, bytes."""

    __slots__ = ("t_s", "device_code", "devices", "op_code", "ops", "requests", "bytes")

    def __init__(self, t_s: npt.ArrayLike, device_code: npt.ArrayLike, devices: Iterable[str],
                 op_code: npt.ArrayLike, ops: Iterable[str], requests: npt.ArrayLike, nbytes: npt.ArrayLike) -> None:
        """Columns of any array-like (each is converted to its dtype; names as given)."""
        self.t_s: Floats = np.asarray(t_s, dtype=np.float64)
        self.device_code: Codes = np.asarray(device_code, dtype=np.int32)
        self.op_code: Codes = np.asarray(op_code, dtype=np.int32)
        self.requests: Ints = np.asarray(requests, dtype=np.int64)
        self.bytes: Ints = np.asarray(nbytes, dtype=np.int64)
        self.devices = tuple(str(d) for d in devices)
        self.ops = tuple(str(o) for o in ops)
        columns = (self.t_s, self.device_code, self.op_code, self.requests, self.bytes)
        if any(len(c) != len(self.t_s) for c in columns):
            raise ValueError("timeline columns differ in length")
        for column in columns:
            column.flags.writeable = False          # a record: read, never changed in place

    @classmethod
    def from_points(cls, points: Iterable[TimelinePoint]) -> Timeline:
        pts = points if isinstance(points, (list, tuple)) else list(points)
        if not pts:
            return cls.from_columns((), (), (), (), ())
        with gc_paused():
            t_s, device, op, requests, nbytes = zip(*pts)     # transposed by C code
            return cls.from_columns(t_s, device, op, requests, nbytes)

    @classmethod
    def from_columns(cls, t_s: Sequence[float], device: Sequence[str], op: Sequence[str],
                     requests: Sequence[int], nbytes: Sequence[int]) -> Timeline:
        """From parallel columns of plain values (names as strings, coded
        in order of first appearance)."""
        dev_index: defaultdict[str, int] = defaultdict(count().__next__)
        op_index: defaultdict[str, int] = defaultdict(count().__next__)
        n = len(t_s)
        return cls(t_s, np.fromiter(map(dev_index.__getitem__, device), np.int32, n), list(dev_index),
                   np.fromiter(map(op_index.__getitem__, op), np.int32, n), list(op_index), requests, nbytes)

    def __len__(self) -> int:
        return len(self.t_s)

    @overload
    def __getitem__(self, i: int) -> TimelinePoint: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[TimelinePoint, ...]: ...

    def __getitem__(self, i: int | slice) -> TimelinePoint | tuple[TimelinePoint, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("timeline index out of range")
        return TimelinePoint(float(self.t_s[i]), self.devices[self.device_code[i]], self.ops[self.op_code[i]],
                             int(self.requests[i]), int(self.bytes[i]))

    def __iter__(self) -> Iterator[TimelinePoint]:
        devices, ops = self.devices, self.ops
        return map(partial(tuple.__new__, TimelinePoint),
                   zip(self.t_s.tolist(), map(devices.__getitem__, self.device_code.tolist()),
                       map(ops.__getitem__, self.op_code.tolist()), self.requests.tolist(), self.bytes.tolist()))

    def __eq__(self, other: object) -> bool:
        """Equal to any timeline, tuple or list of the same points."""
        if isinstance(other, (Timeline, tuple, list)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Timeline({len(self)} points, devices {list(self.devices)})"


_last_converted: tuple[Sequence[TimelinePoint], Timeline] | None = None


def as_timeline(points: Sequence[TimelinePoint]) -> Timeline:
    """`points` as a Timeline: itself if it already is one, else its columns
    (kept for the last sequence converted: a report asks several questions
    of one run)."""
    global _last_converted
    if isinstance(points, Timeline):
        return points
    if _last_converted is not None and _last_converted[0] is points:
        return _last_converted[1]
    timeline = Timeline.from_points(points)
    _last_converted = (points, timeline)
    return timeline


def to_npz_arrays(tl: Timeline) -> dict[str, Any]:
    return {"t_s": tl.t_s, "device_code": tl.device_code, "devices": np.array(tl.devices, dtype=str),
            "op_code": tl.op_code, "ops": np.array(tl.ops, dtype=str), "requests": tl.requests,
            "bytes": tl.bytes}


def from_npz_arrays(data: Any) -> Timeline:
    return Timeline(data["t_s"], data["device_code"], data["devices"], data["op_code"], data["ops"],
                    data["requests"], data["bytes"])


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a bulk build. Left on, it
    walks every object allocated so far each time its counters fill, which
    costs more than the build itself for a million-row timeline (loading a
    24 h x 8 device timeline.csv: 5.8 s with it on, 2.4 s paused)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
