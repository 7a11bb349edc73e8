"""The host's memory during an offload search: the baseline the
predictions start from, and MemAvailable read again before every trial.

    baseline  the job's own process as it calls deepspeed.initialize, measured
              in the run that already starts it to read its tensors (the
              shape probe): its VmRSS then, less the storage its parameters
              hold (the host-memory model counts the parameters DeepSpeed
              keeps as items of their own), plus what initialize itself adds
              (measured once on the machine: iotune.workloads.baseline's
              engine_bytes). Without that measurement (an older hook, a probe
              that failed), iotune's own process, measured once on the machine.
    re-read   MemAvailable is read again right before each trial: one whose
              predicted peak, with the margin, no longer fits what is available
              now is skipped with the numbers (journaled as skipped, tried again
              on resume), and the search goes on. Memory other processes took
              after the search started would otherwise OOM-kill the trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...model import units
from ...model.hook_events import StartupMemory
from ...model.host_memory import BASELINE_JOB, FIT_MARGIN, HostContext, host_fit, host_memory, margin_note
from ...model.offload import JobShape, OffloadKnobs
from ...model.offload_result import HostBaseline, OffloadTrial
from .space import Budget


def job_context(context: HostContext, startup: StartupMemory | None) -> HostContext:
    """`context` with the job's own baseline where the probe measured it
    (`startup`); else as it was (iotune's own process, measured once)."""
    if startup is None:
        return context
    note = (f"VmRSS {units.mib(startup.rss_bytes)} when it called deepspeed.initialize, less "
            f"{units.mib(startup.param_storage_bytes)} of parameter storage")
    return replace(context, baseline_bytes=startup.baseline_bytes, startup_peak_bytes=startup.peak_rss_bytes,
                   baseline_source=BASELINE_JOB, baseline_note=note)


def host_baseline(context: HostContext, margin: float = FIT_MARGIN) -> HostBaseline:
    """What the outcome records of the baseline and the margin."""
    note = context.baseline_note or ("iotune's own process with torch and DeepSpeed, measured once on this machine"
                                     if context.baseline_bytes else "none: left out")
    return HostBaseline(context.baseline_bytes, context.baseline_source if context.baseline_bytes else "", note,
                        context.engine_bytes if context.baseline_source == BASELINE_JOB else 0,
                        context.startup_peak_bytes, margin, margin_note(margin))


def baseline_sentence(context: HostContext) -> str:
    """The baseline and the margin as the search says them (stderr)."""
    if context.baseline_source == BASELINE_JOB:
        what = (f"your job's own process, {units.mib(context.baseline_bytes)} ({context.baseline_note}), plus "
                f"{units.mib(context.engine_bytes)} that deepspeed.initialize adds (measured once on this machine)")
    elif context.baseline_bytes:
        what = (f"iotune's own process with torch and DeepSpeed, {units.mib(context.baseline_bytes)} (your job's "
                f"was not measured)")
    else:
        what = "none (not measured)"
    return f"offload: host-memory baseline: {what}; candidates are admitted with {margin_note()}"


@dataclass(frozen=True)
class MemoryNow:
    """MemAvailable read right before a trial, against the trial's predicted peak with the margin."""

    available_bytes: int | None        # None: not read (no reader, or /proc/meminfo unreadable)
    peak_bytes: int
    margin: float = FIT_MARGIN

    @property
    def needed_bytes(self) -> int:
        return math.ceil(self.peak_bytes * (1 + self.margin))

    @property
    def skip(self) -> bool:
        return self.available_bytes is not None and not host_fit(self.peak_bytes, self.available_bytes,
                                                                 self.margin).admitted

    def sentence(self) -> str:
        return (f"skipped: needs {units.mib(self.needed_bytes)} at its peak with the margin, MemAvailable is now "
                f"{units.mib(self.available_bytes or 0)}")


def memory_now(knobs: OffloadKnobs, shape: JobShape, budget: Budget, context: HostContext) -> MemoryNow:
    """Read MemAvailable (budget.available) for the trial about to run `knobs`."""
    peak = host_memory(knobs, shape, context).peak_bytes
    return MemoryNow(budget.available() if budget.available is not None else None, peak)


def skipped_trial(key: str, changes: dict[str, object], role: str, ran: str, now: MemoryNow,
                  context: HostContext) -> OffloadTrial:
    """The journal's record of a trial skipped for want of memory: never started."""
    return OffloadTrial(key, dict(changes), "skipped", now.sentence(), role=role, ran=ran,
                        predicted_host_bytes=now.peak_bytes, available_bytes=now.available_bytes or 0,
                        baseline_bytes=context.baseline_bytes, baseline_source=context.baseline_source)
