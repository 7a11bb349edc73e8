"""Sweep data: the parameters of one point, what a trial measured, and the
journal record of a trial. Each trial's parameters live in SweepPoint only."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .aio import AioSettings
from .record import JsonRecord

# The wall-clock limit of one trial that runs training steps, in every kind of sweep (--steps-timeout's
# default): the job's process group is killed after it and the trial recorded as failed.
TRIAL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class SweepPoint(JsonRecord):
    """One configuration to measure.

    block_size, queue_depth, intra_op_parallelism, single_submit and
    overlap_events are DeepSpeed's `aio` keys. For fio, intra_op_parallelism
    is the number of jobs (threads) and engine picks libaio or io_uring; the
    aio executor uses DeepSpeed's own engine (libaio) and ignores `engine`.
    omp_threads (0: unset) is the CPU optimizer's thread count
    (OMP_NUM_THREADS), varied only on training steps (the steps and cmd
    executors, in sweep/threads.py's stage).
    """

    block_size: int = 1_048_576
    queue_depth: int = 8
    intra_op_parallelism: int = 1
    single_submit: bool = False
    overlap_events: bool = True
    engine: str = "libaio"
    omp_threads: int = 0

    def key(self) -> str:
        """A stable identifier of the point (same parameters, same key)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def label(self) -> str:
        """The point in words, as the sweep's progress lines name it: "bs=1048576 qd=8 t=1"."""
        return f"bs={self.block_size} qd={self.queue_depth} t={self.intra_op_parallelism}"

    def aio(self) -> AioSettings:
        return AioSettings(block_size=self.block_size, queue_depth=self.queue_depth,
                           intra_op_parallelism=self.intra_op_parallelism,
                           single_submit=self.single_submit, overlap_events=self.overlap_events)

    def pinned_bytes(self) -> int:
        """Staging memory the point implies: one block per queue slot per thread."""
        return self.block_size * self.queue_depth * self.intra_op_parallelism



@dataclass(frozen=True)
class Measurement(JsonRecord):
    """What one trial measured. Bandwidths are bytes/s (decimal when printed
    as MB/s); latencies are µs; seconds for step-level metrics."""

    read_bytes_per_s: float = 0.0
    write_bytes_per_s: float = 0.0
    read_iops: float = 0.0
    write_iops: float = 0.0
    read_lat_p50_us: float | None = None
    read_lat_p99_us: float | None = None
    write_lat_p50_us: float | None = None
    write_lat_p99_us: float | None = None
    cpu_usr_pct: float | None = None
    cpu_sys_pct: float | None = None
    step_s: float | None = None             # steps executor: median step time
    optimizer_step_s: float | None = None   # steps executor: median optimizer step time

    @property
    def score(self) -> float:
        """Higher is better: the harmonic mean of read and write bandwidth
        (swapping moves as many bytes each way, so time is the sum of both),
        or the inverse step time for training steps."""
        if self.step_s:
            return 1.0 / self.step_s
        r, w = self.read_bytes_per_s, self.write_bytes_per_s
        if r > 0 and w > 0:
            return 2.0 / (1.0 / r + 1.0 / w)
        return max(r, w)



@dataclass(frozen=True)
class Trial:
    """One measurement of one point by one executor, as journaled."""

    executor: str                 # fio | aio | steps
    point: SweepPoint
    repeat: int
    status: str                   # ok | failed
    measurement: Measurement | None = None
    error: str = ""
    started_at: str = ""
    seconds: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict)   # the executor's raw output (fio JSON, ...)
    pair_order: str = ""          # a confirmation pair's trial: candidate-first | reference-first ("": no pair)

    def to_json(self) -> dict[str, Any]:
        return {
            "executor": self.executor, "point": self.point.to_json(), "key": self.point.key(),
            "repeat": self.repeat, "status": self.status,
            "measurement": self.measurement.to_json() if self.measurement else None,
            "error": self.error, "started_at": self.started_at, "seconds": self.seconds, "raw": self.raw,
            **({"pair_order": self.pair_order} if self.pair_order else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trial:
        m = data.get("measurement")
        return cls(executor=data["executor"], point=SweepPoint.from_json(data["point"]),
                   repeat=int(data.get("repeat", 0)), status=data.get("status", "ok"),
                   measurement=Measurement.from_json(m) if m else None, error=data.get("error", ""),
                   started_at=data.get("started_at", ""), seconds=float(data.get("seconds", 0.0)),
                   raw=data.get("raw") or {}, pair_order=str(data.get("pair_order", "")))


@dataclass(frozen=True)
class Proposal:
    """Points the search wants measured next, all at one repeat index."""

    points: tuple[SweepPoint, ...]
    repeat: int = 0
