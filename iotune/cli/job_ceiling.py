"""`--ceiling` for a run that holds a swap schedule: the job-pattern ceiling.

The run's steady step's swap I/O (TraceRun.swap_schedule) is replayed
without its compute on the drive that held its swap directory, in a scratch
directory there (iotune.sweep.replay.job_ceiling: DeepSpeed's own
aio_handle, in iotune's cgroup, as the traced job was), CEILING_REPEATS
times at DeepSpeed's default aio settings and at the job's own: the best
setting's median, with its spread. When the run's median steady step moved
faster than the top of that spread, it is measured once more before the
verdict says to re-measure.

Why CEILING_REPEATS = 5, not the 3 a spread needs: the run is held to the
top of the spread, and a job that runs at the drive's limit (I/O-bound, as
on a capped drive) draws its steps from the same rates as the replays. The
median of its steps beats the largest of 3 replays one time in 8, of 5 one
time in 32; with the re-measure, a false "re-measure" is then about one in
a thousand. Two more replays cost seconds at CI scale, about two minutes
per setting for a 1B model's 35 GB step. A run it cannot serve (no schedule, several ranks
swapping, its swap directory on a drive that is not here) gets the fio probe
instead, and the reason on stderr.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IotuneError
from ..model import units
from ..model.aio import DEEPSPEED_AIO_DEFAULTS, AioSettings
from ..model.job_ceiling import MeasuredJobCeiling, job_pattern_label
from ..model.replay import SwapSchedule
from ..model.replay_result import MIN_CEILING_REPEATS, JobCeiling, check_against_ceiling
from ..model.run import TraceRun

if TYPE_CHECKING:
    from ..blockdev.devices import BlockDevice

CEILING_REPEATS = max(5, MIN_CEILING_REPEATS)    # replays per setting (see above)
START_S = 15.0                  # the replayer's start (torch and DeepSpeed imported), per setting: for the estimate
FALLBACK = "the fio probe measures instead (fio's pattern, not this job's)"


def measure_job_ceiling(run: TraceRun, present: Sequence[BlockDevice],
                        say: Callable[[str], None]) -> MeasuredJobCeiling | None:
    """The run's job-pattern ceiling measured now, or None (said why) when it cannot be."""
    schedule = run.swap_schedule
    why = why_no_replay(run)
    if why is not None or schedule is None:
        say(f"ceiling: {why}: {FALLBACK}")
        return None
    try:
        device, directory = replay_place(schedule, present)
    except IotuneError as e:
        say(f"ceiling: {e}: {FALLBACK}")
        return None
    settings = ceiling_settings(schedule)
    say(f"ceiling: replaying step {schedule.step}'s swap I/O ({units.volume(schedule.total_bytes)}) without compute "
        f"on {device} in {directory}, {CEILING_REPEATS} times at {len(settings)} aio setting(s) "
        f"(~{estimate_s(schedule, len(settings)):.0f} s)")
    try:
        first = _measure(schedule, directory, settings)
        measured = steady_rate(run, device)
        if measured is None or check_against_ceiling(measured, first) is None:
            return MeasuredJobCeiling(device, str(directory), first, _now())
        say(f"ceiling: the run's median steady step moved {units.mb_s(measured)} while busy, above the top of "
            f"{job_pattern_label(first)}: measuring it once more")
        return MeasuredJobCeiling(device, str(directory), _measure(schedule, directory, settings), _now(), (first,))
    except IotuneError as e:
        say(f"warning: the job-pattern ceiling could not be measured: {e}; {FALLBACK}")
        return None


def why_no_replay(run: TraceRun) -> str | None:
    """Why the run's ceiling cannot be its own swap pattern, or None when it can."""
    if run.swap_schedule is None:
        return ("the run holds no swap schedule of a steady NVMe optimizer step (traced by an older iotune or with "
                "--no-inject, no optimizer state on NVMe, a single step, or parameters swapped to NVMe)")
    ranks = sorted({s.rank for s in run.attribution.swaps}) if run.attribution else []
    if len(ranks) > 1:
        return (f"{len(ranks)} ranks swapped to the drive at once, and the replay repeats rank "
                f"{run.swap_schedule.rank}'s swap I/O alone, a fraction of the drive's load")
    return None


def replay_place(schedule: SwapSchedule, present: Sequence[BlockDevice]) -> tuple[str, Path]:
    """(the traced device, a directory on it) where the schedule's swap files were: the swap
    directory, or its nearest parent that still exists. IotuneError when that is not on a traced
    device that is still here."""
    from ..blockdev.devices import devices_for_path

    if not schedule.swap_dir:
        raise IotuneError("the run's swap schedule does not say where its swap files were (an older iotune's)")
    directory = next((p for p in (Path(schedule.swap_dir), *Path(schedule.swap_dir).parents) if p.is_dir()))
    holders = [d.name for d in devices_for_path(str(directory))]
    here = [d.name for d in present]
    if len(holders) != 1 or holders[0] not in here:
        on = ", ".join(holders)
        traced = ", ".join(here) or "none of them"
        raise IotuneError(f"{directory}, where the swap files were ({schedule.swap_dir}), is on {on}, not on one "
                          f"traced device that is here ({traced}); recreate the swap directory on the traced drive")
    return holders[0], directory


def ceiling_settings(schedule: SwapSchedule) -> list[AioSettings]:
    """DeepSpeed's default aio settings, and the job's own when they differ (GPUDirect Storage is not replayed)."""
    own = schedule.traced_aio
    if own is None or own.use_gds or own == DEEPSPEED_AIO_DEFAULTS:
        return [DEEPSPEED_AIO_DEFAULTS]
    return [DEEPSPEED_AIO_DEFAULTS, own]


def estimate_s(schedule: SwapSchedule, settings: int) -> float:
    """Roughly how long the measure takes: per setting, the start, the layout and the repeats at the traced rate."""
    rate = schedule.traced_bytes_per_s or 100e6
    layout = sum(schedule.files().values()) / rate
    return settings * (START_S + layout + CEILING_REPEATS * schedule.total_bytes / rate)


def steady_rate(run: TraceRun, device: str) -> float | None:
    """What the verdict compares with the device's ceiling: its bandwidth while busy in the median steady step."""
    from ..analysis.device_use import BRIDGE_S, steady_use

    found = steady_use(run, device, BRIDGE_S)
    return found.bytes_per_s if found is not None else None


def _measure(schedule: SwapSchedule, directory: Path, settings: list[AioSettings]) -> JobCeiling:
    from ..sweep.executor import Target
    from ..sweep.replay import job_ceiling

    return job_ceiling(schedule, Target(directory), settings, CEILING_REPEATS)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
