"""The step-record protocol between a training process and iotune: one line
per finished step on stdout, `IOTUNE_STEP {json}`, written by the built-in
workload and read by the sweep's steps executor and the demo (both keep the
lines off the terminal: the demo in its run's job.log). With --step-log FILE
the workload appends the same lines to FILE too, which StepFollower follows
while the job runs. StepProgress is what progress displays get."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .record import JsonRecord

STEP_PREFIX = "IOTUNE_STEP "


@dataclass(frozen=True)
class StepRecord(JsonRecord):
    step: int
    loss: float
    step_s: float
    optimizer_step_s: float
    omp_threads: int = 0            # OpenMP threads the CPU optimizer ran with (0: not reported)
    locked_bytes: int = 0           # the rank-0 process's VmLck after the step (mlock'd: swap buffers)
    rss_bytes: int = 0              # its VmRSS after the step
    peak_rss_bytes: int = 0         # its VmHWM (peak RSS) so far

    def line(self) -> str:
        """The protocol line (without the newline)."""
        return STEP_PREFIX + json.dumps(asdict(self))



def parse_steps(text: str) -> list[StepRecord]:
    """Every step record in a process's stdout, in order; other lines are
    the program's own output and are skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith(STEP_PREFIX):
            try:
                out.append(StepRecord.from_json(json.loads(line[len(STEP_PREFIX):])))
            except (ValueError, TypeError):
                continue
    return out


@dataclass(frozen=True)
class StepProgress:
    """A training job's progress, for displays: `done` of `total` steps
    finished (0: it started, no step finished yet), with the last finished
    step's time and loss (None: not known, e.g. the loss of a user's job,
    which iotune times through its startup hook)."""

    done: int
    total: int
    step_s: float | None = None
    loss: float | None = None


class StepFollower:
    """Follows the step records a job appends to a file (its log, or the
    workload's --step-log) and tells `on_step` each one, as a StepProgress of
    `total` steps; when made, that the job started (0 done). poll() reads
    what was appended since its last call, complete lines only, so a record
    half written when looked at is read whole the next time."""

    def __init__(self, path: Path, total: int, on_step: Callable[[StepProgress], None]) -> None:
        self.path, self.total, self.on_step = path, total, on_step
        self._offset = 0
        self._partial = b""
        on_step(StepProgress(0, total))

    def poll(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for r in parse_steps(b"\n".join(lines).decode(errors="replace")):
            self.on_step(StepProgress(r.step, self.total, r.step_s, r.loss))
