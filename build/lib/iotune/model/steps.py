"""The step-record protocol between a training process and iotune: one line
per finished step on stdout, `IOTUNE_STEP {json}`, written by the built-in
workload and read by the sweep's steps executor."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

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
