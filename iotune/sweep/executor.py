"""The executor interface: one per backend (fio, aio, steps)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import IotuneError
from ..model.steps import StepProgress
from ..model.sweep import Measurement, SweepPoint


class TrialFailed(IotuneError):
    """One trial could not be measured; the sweep records it and goes on,
    unless `stops_sweep` (every later trial would fail the same way, e.g. on
    a DeepSpeed op-build lock nobody holds)."""

    def __init__(self, message: str, raw: dict[str, Any] | None = None, stops_sweep: bool = False) -> None:
        super().__init__(message)
        self.raw = raw or {}
        self.stops_sweep = stops_sweep


class SweepStopped(IotuneError):
    """A trial failed in a way every later trial would too: the sweep stops
    after journaling it; the message names the fix."""


class DriveGone(IotuneError):
    """The drive under test stopped working mid-sweep (an emulated drive's
    FUSE daemon died): every later trial would fail the same way, so the
    sweep stops, and the failed trial is not journaled (it runs on resume)."""


@dataclass(frozen=True)
class Target:
    """Where trials do their I/O: a directory on the drive under test, and
    how much each trial moves. Like DeepSpeed's swapper, a trial writes
    `files` tensor files of `file_bytes` each with O_DIRECT, then reads them
    back."""

    directory: Path
    file_bytes: int = 64 << 20
    files: int = 3
    cgroup: str | None = None     # run trials in this cgroup (v1 directory), e.g. a capped drive's
    runtime_s: float = 0.0        # fio: measure each direction for this long (0: move the bytes once)
    ramp_s: float = 0.0           # fio: and leave this much out at the start (throttle bursts, warm-up)
    # asked after a failed trial: what is wrong with the drive itself (None: nothing known), e.g. a
    # test bed whose FUSE daemon is gone
    trouble: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)
    # where the trials' files go, inside `directory`: a directory the ledger records, so a sweep killed
    # outright leaves nothing in the user's own directory (None: `directory` itself, a test bed's)
    scratch: Path | None = None
    # while a trial trains: told when its job starts and as each step finishes (a progress display's;
    # None: nobody listens)
    on_step: Callable[[StepProgress], None] | None = field(default=None, compare=False, repr=False)

    @property
    def files_dir(self) -> Path:
        """Where the trials write their files."""
        return self.scratch or self.directory


class Executor(Protocol):
    name: str

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        """Measure `point` on `target`: (measurement, raw output to journal).
        Raises TrialFailed when the trial cannot be measured."""
        ...
