"""Injecting the attribution hooks into a traced command and reading back
what they recorded. The hook directory is located by iotune.resources and
its event files are parsed by model.hook_events (shared with the sweep's
user-command executor)."""

from __future__ import annotations

from pathlib import Path

from ..model.hook_events import hook_env, read_events
from ..resources import inject_dir

INJECT_DIR = inject_dir()

__all__ = ["INJECT_DIR", "inject_env", "read_events"]


def inject_env(env: dict[str, str], events_dir: Path) -> dict[str, str]:
    """`env` with the startup hook on PYTHONPATH and the events directory set."""
    return hook_env(env, INJECT_DIR, events_dir)
