"""Injecting the attribution hooks into a traced command and reading back
what they recorded. The hook directory is located by iotune.resources and
its event files are parsed by model.hook_events (shared with the sweep's
user-command executor)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..model.hook_events import hook_env, read_events
from ..model.replay import ScheduleError, SwapSchedule, read_swap_schedule
from ..resources import inject_dir

INJECT_DIR = inject_dir()
TRACE_SOURCE = "iotune trace (the startup hook's events)"

__all__ = ["INJECT_DIR", "inject_env", "read_events", "read_schedule"]


def inject_env(env: dict[str, str], events_dir: Path) -> dict[str, str]:
    """`env` with the startup hook on PYTHONPATH and the events directory set."""
    return hook_env(env, INJECT_DIR, events_dir)


def read_schedule(events_dir: Path) -> SwapSchedule | None:
    """The swap schedule of rank 0's steady optimizer step (the one with the
    median optimizer time), saved with the run so a ceiling can replay it;
    None when the job had none to replay (no NVMe optimizer offload, a single
    step, parameters swapped to NVMe)."""
    try:
        schedule = read_swap_schedule(events_dir)
    except ScheduleError:
        return None
    return replace(schedule, source=TRACE_SOURCE)      # the events directory is removed after the trace
