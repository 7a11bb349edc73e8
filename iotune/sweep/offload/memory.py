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
    corrected once your config (the reference) has run: what its VmHWM
              measured above its predicted peak is added to every prediction
              that follows (the model's error is mostly the job's: the C
              allocator keeping freed memory, what the job holds that the
              model does not know), and candidates are admitted again with the
              smaller margin measured for corrected predictions
              (CALIBRATED_MARGIN). A candidate refused before may fit then, and
              one admitted may no longer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...model import units
from ...model.hook_events import StartupMemory
from ...model.host_memory import (BASELINE_JOB, CALIBRATED_MARGIN, FIT_MARGIN, HostContext, host_fit, host_memory,
                                  margin_note)
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


def corrected(context: HostContext, trial: OffloadTrial) -> HostContext | None:
    """`context` corrected by a trial that ran (the reference): what its
    VmHWM measured above its predicted peak, added to every prediction that
    follows (never taken off: an over-prediction is left as it is). None:
    the trial has no peak to learn from."""
    if trial.status != "ok" or not trial.peak_rss_bytes or not trial.predicted_host_bytes:
        return None
    above = max(0, trial.peak_rss_bytes - trial.predicted_host_bytes)
    note = (f"your config's trial peaked at {units.mib(trial.peak_rss_bytes)} (VmHWM), predicted "
            f"{units.mib(trial.predicted_host_bytes)}")
    return replace(context, correction_bytes=context.correction_bytes + above, correction_note=note)


def host_baseline(context: HostContext, margin: float = FIT_MARGIN) -> HostBaseline:
    """What the outcome records of the baseline and the margin."""
    note = context.baseline_note or ("iotune's own process with torch and DeepSpeed, measured once on this machine"
                                     if context.baseline_bytes else "none: left out")
    return HostBaseline(context.baseline_bytes, context.baseline_source if context.baseline_bytes else "", note,
                        context.engine_bytes if context.baseline_source == BASELINE_JOB else 0,
                        context.startup_peak_bytes, margin, margin_note(margin), context.correction_bytes,
                        context.correction_note)


def correction_sentence(context: HostContext, admitted: int, before: int) -> str:
    """What the reference trial taught the predictions, as the search says it (stderr)."""
    change = "" if admitted == before else f" ({admitted - before:+d})"
    return (f"offload: host memory corrected on your config's trial: {context.correction_note}; every prediction "
            f"now adds {units.mib(context.correction_bytes)}, and candidates are admitted with "
            f"{margin_note(CALIBRATED_MARGIN)}: {admitted} fit{change}")


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
    return MemoryNow(budget.available() if budget.available is not None else None, peak, budget.margin)


def skipped_trial(key: str, changes: dict[str, object], role: str, ran: str, now: MemoryNow,
                  context: HostContext) -> OffloadTrial:
    """The journal's record of a trial skipped for want of memory: never started."""
    return OffloadTrial(key, dict(changes), "skipped", now.sentence(), role=role, ran=ran,
                        predicted_host_bytes=now.peak_bytes, available_bytes=now.available_bytes or 0,
                        baseline_bytes=context.baseline_bytes, baseline_source=context.baseline_source)
