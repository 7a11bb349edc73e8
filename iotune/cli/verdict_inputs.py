"""What the verdict needs beyond the run, gathered by the CLI (it alone may
call the system layers): each traced device's ceiling (a sweep journal of the
same drive, or the `--ceiling` fio probe) and the drive's rated endurance
(`--drive-tbw`, or estimated from its SMART/NVMe data)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from ..errors import IotuneError
from ..model import units
from ..model.run import TraceRun
from ..model.verdict import DeviceCeiling, TraceReport, VerdictInputs
from .options import F, endurance_options, option_group


def verdict_options(fn: F) -> F:
    """--ceiling, --drive-tbw, --drive-capacity: inputs of the trace verdict."""
    fn = endurance_options(tbw_default="estimated from the drive's SMART/NVMe data, when it has any",
                           capacity_default="the traced device's size")(fn)
    fn = click.option("--ceiling", "probe_ceiling", is_flag=True,
                      help="Measure each traced device's ceiling with a short fio probe (~9 s, writes 2 "
                           "temporary files on its filesystem) for the verdict; without it, the ceiling comes "
                           "from a sweep journal of the same drive in ./iotune-sweeps, if any.")(fn)
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


def ceilings(run: TraceRun, probe: bool, say: Callable[[str], None]) -> tuple[DeviceCeiling, ...]:
    from ..sweep.ceiling import PROBE_RAMP_S, PROBE_RUNTIME_S, journal_ceiling, probe_ceiling

    out = []
    for dev in _present(run):
        try:
            if probe:
                say(f"ceiling: probing {dev.name} with fio for ~{2 * (PROBE_RUNTIME_S + PROBE_RAMP_S):.0f} s")
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
    return tuple(out)


def gather_inputs(run: TraceRun, given: VerdictOptions, say: Callable[[str], None],
                  known: tuple[DeviceCeiling, ...] = ()) -> VerdictInputs:
    from ..blockdev.smart import drive_wear

    tbw, capacity = given.drive_tbw, given.drive_capacity
    found = ceilings(run, given.probe_ceiling, say) if not known else known
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
                         drive_capacity_bytes=float(capacity) if capacity else None)


def trace_report(run: TraceRun, inputs: VerdictInputs) -> TraceReport:
    from ..analysis.verdict import judge

    return TraceReport(run, judge(run, inputs))
