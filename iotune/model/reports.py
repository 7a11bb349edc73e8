"""Report envelopes: what one CLI command hands its renderer, when that is
more than a single record (a comparison of runs, a plan with its check, lint
findings for a file, doctor's checks). Each renderer in render/ is keyed by
one of these types (or a record type) and an output format."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .checks import CheckResult
from .lint import LintFailure, LintFinding
from .plan import CheckpointPlan, Plan
from .run import TraceRun
from .verdict import Finding


@dataclass(frozen=True)
class CompareRow:
    """One run in `iotune compare`: medians over steady steps; bytes are
    block-layer bytes per step unless named swap."""

    label: str
    steps: int
    step_s: float | None
    optimizer_s: float | None
    read_bytes_per_step: float | None
    write_bytes_per_step: float | None
    swap_bytes_per_step: float | None
    dominant_size_bytes: int | None
    bytes_per_s: float            # block bytes (read + write) over the whole run / duration
    total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    rows: tuple[CompareRow, ...]     # the first is the reference
    runs: tuple[TraceRun, ...] = ()  # the runs themselves, row for row (for overlaid plots); may be empty


@dataclass(frozen=True)
class CheckRow:
    """`iotune plan --check`: predicted against measured bytes per optimizer
    step, for one category and direction."""

    category: str
    direction: str
    predicted_bytes: float
    measured_bytes: float

    @property
    def error_pct(self) -> float | None:
        if self.measured_bytes == 0:
            return None if self.predicted_bytes == 0 else float("inf")
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


@dataclass(frozen=True)
class PlanReport:
    plan: Plan
    check: tuple[CheckRow, ...] | None = None     # None: no --check run given
    endurance: Finding | None = None              # None: the plan writes nothing to NVMe
    checkpoint: CheckpointPlan | None = None      # one checkpoint's parts, save/load time, --keep, --checkpoint-every


@dataclass(frozen=True)
class LintReport:
    config: str                                    # the file as the user named it
    findings: tuple[LintFinding, ...]
    error: LintFailure | None = None               # the config could not be linted at all
    checked_against: str | None = None             # e.g. "DeepSpeed 0.19.8 (installed)"
    accelerator: str | None = None                 # the accelerator the rules assumed, and how it was chosen

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity != "error" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config}
        if self.error is not None:
            out["error"] = self.error.to_json()
        out.update({"checked_against": self.checked_against, "accelerator": self.accelerator,
                    "findings": [f.to_json() for f in self.findings],
                    "errors": self.errors, "warnings": self.warnings})
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LintReport:
        err = d.get("error")
        return cls(str(d.get("config", "")), tuple(LintFinding.from_json(f) for f in d.get("findings", [])),
                   LintFailure.from_json(err) if isinstance(err, dict) else None,
                   d.get("checked_against"), d.get("accelerator"))


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)
