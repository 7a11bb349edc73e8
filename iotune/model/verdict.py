"""What a trace concludes: the verdict at the top of every trace report
(console, JSON, HTML), and the envelope a trace report is rendered from.

A Verdict is derived (analysis.verdict.judge), never stored in run.json: a
saved run is judged again by the iotune that reads it, so older runs get
today's rules. The inputs that are not in the run (the device's ceiling, the
drive's rated endurance) come in as VerdictInputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import units

from .job_ceiling import MeasuredJobCeiling, job_pattern_label
from .replay_result import JobCeiling
from .run import TraceRun

# Verdict.limit values.
STORAGE_BOUND = "storage-bound"
CPU_OPTIMIZER_BOUND = "cpu-optimizer-bound"
COMPUTE_BOUND = "compute-bound"
STARTUP_DOMINATED = "startup-dominated"
NO_TRAINING = "no-training"            # not a DeepSpeed job (no phases recorded)
NOT_ON_DEVICE = "not-on-traced-device"  # a training job whose swap I/O missed the traced devices
UNKNOWN = "unknown"
LIMITS: tuple[str, ...] = (STORAGE_BOUND, CPU_OPTIMIZER_BOUND, COMPUTE_BOUND, STARTUP_DOMINATED,
                           NO_TRAINING, NOT_ON_DEVICE, UNKNOWN)

# Finding.kind values, in the order a report shows them.
KINDS: tuple[str, ...] = ("stall", "distance", "limit", "advice", "endurance", "note")

Figure = float | int | str | None


@dataclass(frozen=True)
class Finding:
    """One claim of the verdict: a plain sentence with its figures, and the
    rule that produced it (shown in reports, explained in docs/guide/report.md)."""

    kind: str                      # one of KINDS
    headline: str                  # one sentence, figures included, units explicit
    rule: str = ""                 # the rule used, in words
    figures: dict[str, Figure] = field(default_factory=dict)   # the numbers behind it, SI units

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "headline": self.headline, "rule": self.rule, "figures": dict(self.figures)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(kind=str(data["kind"]), headline=str(data["headline"]), rule=str(data.get("rule", "")),
                   figures=dict(data.get("figures") or {}))


@dataclass(frozen=True)
class Verdict:
    limit: str                     # one of LIMITS
    summary: str                   # one line: what limits the step, and the one thing to do
    findings: tuple[Finding, ...] = ()

    def of_kind(self, kind: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.kind == kind)

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "summary": self.summary, "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(limit=str(data["limit"]), summary=str(data["summary"]),
                   findings=tuple(Finding.from_json(f) for f in data.get("findings", ())))


@dataclass(frozen=True)
class DeviceCeiling:
    """What one traced device can do, and where that figure came from.

    With `job`, the figure is the job's own swap pattern replayed without
    its compute (the fastest this job's pattern moves on the drive: an upper
    bound for it, with a spread); with `cap`, it is a limit set on the drive
    (a blkio cap) rather than measured; otherwise it was measured with
    another pattern (fio's, a sweep's), which the job may beat."""

    device: str                    # as in TraceRun.devices[].name
    bytes_per_s: float             # read and write together (the sweep's score: their harmonic mean)
    source: str                    # e.g. "sweep journal iotune-sweeps/default-fio-1a2b3c4d", "fio probe (--ceiling)"
    read_bytes_per_s: float | None = None     # each direction alone, when measured
    write_bytes_per_s: float | None = None
    lat_us: float | None = None               # mean per-request latency at the measured point, if known
    job: JobCeiling | None = None             # the job-pattern ceiling this figure is the median of
    cap: bool = False                         # a limit set on the drive (the demo's blkio cap), not measured

    @classmethod
    def of_job(cls, m: MeasuredJobCeiling) -> DeviceCeiling:
        """A run's job-pattern ceiling as the verdict takes it."""
        again = f"; measured again ({m.attempts} measurements): the run was faster than the first" if m.earlier else ""
        return cls(m.device, m.ceiling.bytes_per_s,
                   f"this job's swap pattern replayed on {m.device} in {m.directory}: {m.ceiling.sentence}{again}",
                   job=m.ceiling)

    @property
    def kind(self) -> str:
        """"job-pattern" (the job's own swap pattern replayed), "cap" (a limit set on the drive) or
        "other-pattern" (measured with fio's pattern, or a sweep's)."""
        return JOB_PATTERN if self.job is not None else CAP if self.cap else OTHER_PATTERN

    @property
    def top_bytes_per_s(self) -> float:
        """The fastest it measured: the top of a job-pattern ceiling's spread, else the figure itself."""
        return self.job.max_bytes_per_s if self.job is not None else self.bytes_per_s

    @property
    def label(self) -> str:
        """How a sentence names it after "its", figure and kind included: "ceiling, this job's swap
        pattern replayed, 41.5 MB/s (41.3–41.8, 3 runs)" or "60.8 MB/s ceiling (fio probe …; not this
        job's pattern)"."""
        if self.job is not None:
            return f"ceiling, {job_pattern_label(self.job)}"
        if self.cap:
            return f"{units.mb_s(self.bytes_per_s)} ceiling ({self.source})"
        return f"{units.mb_s(self.bytes_per_s)} ceiling ({self.source}; not this job's pattern)"


JOB_PATTERN, CAP, OTHER_PATTERN = "job-pattern", "cap", "other-pattern"


@dataclass(frozen=True)
class VerdictInputs:
    """What the verdict needs that the run does not hold."""

    ceilings: tuple[DeviceCeiling, ...] = ()
    drive_tbw_bytes: float | None = None   # rated endurance (total bytes written), if known
    tbw_source: str = ""                    # "--drive-tbw", "SMART ...", ...
    drive_written_bytes: float | None = None   # already written to the drive (SMART/NVMe data), if known
    drive_capacity_bytes: float | None = None  # one drive's capacity, overriding the run's device sizes


@dataclass(frozen=True)
class TraceReport:
    """What `iotune trace` and `iotune report` render: the run and its verdict."""

    run: TraceRun
    verdict: Verdict | None = None
