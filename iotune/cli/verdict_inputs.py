"""What the verdict needs beyond the run, gathered by the CLI (it alone may
call the system layers): each traced device's ceiling and the drive's rated
endurance (`--drive-tbw`, or estimated from its SMART/NVMe data).

The ceiling of the drive that held the job's swap files is the job's own
swap pattern replayed without compute (cli.job_ceiling), measured by
`--ceiling` when the run holds a swap schedule and saved with the run, so a
later report without `--ceiling` takes it again. Any other device, and that
one when its pattern cannot be replayed, gets the `--ceiling` fio probe, or
without `--ceiling` a sweep journal of the same drive: a ceiling measured
with another pattern, which the job may beat."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from ..errors import IotuneError
from ..model import units
from ..model.job_ceiling import MeasuredJobCeiling, job_pattern_label
from ..model.run import TraceRun
from ..model.verdict import DeviceCeiling, TraceReport, VerdictInputs
from .job_ceiling import measure_job_ceiling
from .options import F, endurance_options, option_group


def verdict_options(fn: F) -> F:
    """--ceiling, --drive-tbw, --drive-capacity: inputs of the trace verdict."""
    fn = endurance_options(tbw_default="estimated from the drive's SMART/NVMe data, when it has any",
                           capacity_default="the traced device's size")(fn)
    fn = click.option("--ceiling", "probe_ceiling", is_flag=True,
                      help="Measure each traced device's ceiling for the verdict: on the drive that held the "
                           "swap files, the job's own swap I/O of one steady step replayed without compute (5 "
                           "times at DeepSpeed's default aio settings and at the job's; saved with the run); on "
                           "the others, or when the run holds no swap schedule, a short fio probe (~9 s, 2 "
                           "temporary files on its filesystem), whose pattern is not the job's. Without it: the "
                           "job-pattern ceiling saved with the run, else a sweep journal of the same drive in "
                           "./iotune-sweeps, if any.")(fn)
    return fn


@dataclass(frozen=True)
class VerdictOptions:
    """--ceiling, --drive-tbw and --drive-capacity."""

    probe_ceiling: bool
    drive_tbw: int | None
    drive_capacity: int | None


def verdict_group(fn: F) -> F:
    """verdict_options as one VerdictOptions (`verdict`)."""
    return option_group(VerdictOptions, "verdict", verdict_options)(fn)


def _present(run: TraceRun) -> list[Any]:
    """The run's top-level devices that moved data and exist now with the
    same number (only those are looked up or probed)."""
    from ..blockdev.devices import device_by_number

    out = []
    for d in run.devices:
        moved = d.direction("read").bytes + d.direction("write").bytes
        now = device_by_number(d.major, d.minor) if not d.is_lower and moved else None
        if now is not None and now.name == d.name:
            out.append(now)
    return out


def ceilings(run: TraceRun, probe: bool,
             say: Callable[[str], None]) -> tuple[tuple[DeviceCeiling, ...], MeasuredJobCeiling | None]:
    """Each device's ceiling, and the job-pattern ceiling measured now (None: none was)."""
    from ..sweep.ceiling import PROBE_RAMP_S, PROBE_RUNTIME_S, journal_ceiling, probe_ceiling

    present = _present(run)
    measured = measure_job_ceiling(run, present, say) if probe else None
    job = measured if probe else run.job_ceiling
    out = [DeviceCeiling.of_job(job)] if job is not None else []
    if job is not None:
        when = "" if measured is not None else f", saved with the run ({job.measured_at or 'time unknown'})"
        say(f"ceiling of {job.device}: {job_pattern_label(job.ceiling)}{when}")
    for dev in present:
        if job is not None and dev.name == job.device:
            continue
        found: DeviceCeiling | None
        try:
            if probe:
                say(f"ceiling: probing {dev.name} with fio for ~{2 * (PROBE_RUNTIME_S + PROBE_RAMP_S):.0f} s "
                    f"(1 MiB requests: fio's pattern, not this job's)")
                found = probe_ceiling(dev)
            else:
                found = journal_ceiling(dev)
        except IotuneError as e:
            say(f"warning: {e}")
            continue
        if found is not None:
            say(f"ceiling of {dev.name}: {units.mb_s(found.bytes_per_s)} ({found.source})")
            out.append(found)
    if probe and not out:
        say("warning: --ceiling measured no device: the verdict's distance to the device stays unknown")
    return tuple(out), measured


def gather_inputs(run: TraceRun, given: VerdictOptions, say: Callable[[str], None],
                  known: tuple[DeviceCeiling, ...] = ()) -> tuple[VerdictInputs, MeasuredJobCeiling | None]:
    """The verdict's inputs, and the job-pattern ceiling measured now (to save with the run; None: none was)."""
    from ..blockdev.smart import drive_wear

    tbw, capacity = given.drive_tbw, given.drive_capacity
    found, measured = ceilings(run, given.probe_ceiling, say) if not known else (known, None)
    written = {d.name: d.direction("write").bytes for d in run.devices}
    present = sorted(_present(run), key=lambda d: -written.get(d.name, 0))
    wear = drive_wear(present[0]) if present else None
    if tbw:
        rated, source = float(tbw), "--drive-tbw"
    elif wear is not None and wear.tbw_bytes:
        rated, source = wear.tbw_bytes, wear.source
    else:
        rated, source = None, ""
    return VerdictInputs(ceilings=found, drive_tbw_bytes=rated, tbw_source=source,
                         drive_written_bytes=wear.written_bytes if wear else None,
                         drive_capacity_bytes=float(capacity) if capacity else None), measured


def trace_report(run: TraceRun, inputs: VerdictInputs) -> TraceReport:
    from ..analysis.verdict import judge

    return TraceReport(run, judge(run, inputs))
