"""A traced job and DeepSpeed's op-build locks (opbuild.oplocks).

A DeepSpeed job that loads an op whose build lock was left by a killed build
waits forever, printing nothing. `iotune trace` therefore:

- before starting a Python command (python, deepspeed, torchrun, accelerate,
  or a script with a python shebang), refuses with the sweep's message when
  a stale lock (no holder, no builder, older than 10 minutes) is in the
  extension cache the job's environment points at; any other command (a
  shell script that may start one) gets the same message as a warning and
  starts;
- while the job runs, names once on stderr each lock that nobody holds or
  builds under (seen twice a second apart, any age: a build killed during
  this run counts). With the startup hook's events, only until the job's
  first completed training step (DeepSpeed loads its ops in
  deepspeed.initialize, before it); without them (--no-inject, a job the
  hook does not reach), for the whole run once the job has run
  NO_HOOK_AFTER_S, long enough that a lock it merely passes through is gone.
  The job is never stopped: removing the lock lets it go on.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ..opbuild.oplocks import BuildLock, LockWatch, hang_note, stale_lock_problem, stale_locks
from ..errors import UsageError
from ..model.hook_events import completed_steps

NO_HOOK_AFTER_S = 10.0
PYTHON_COMMANDS = re.compile(r"(python[0-9.]*|deepspeed|ds|torchrun|accelerate)")


def runs_python(argv: list[str], env: dict[str, str]) -> bool:
    """Whether the command starts a Python program: by its name, or by its
    file's `#!` line."""
    if not argv:
        return False
    if PYTHON_COMMANDS.fullmatch(os.path.basename(argv[0])):
        return True
    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    try:
        with open(exe or argv[0], "rb") as fh:
            first = fh.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def check_before_start(argv: list[str], env: dict[str, str]) -> str | None:
    """UsageError for a Python command facing a stale build lock; for any
    other command, the same message to show as a warning (else None)."""
    problem = stale_lock_problem(env)
    if problem is None:
        return None
    if runs_python(argv, env):
        raise UsageError(f"{problem}; `iotune trace` does not start a Python job that would wait on it")
    return f"iotune: warning: {problem}, if this command loads DeepSpeed's ops"


class JobLockWatch:
    """Polled from the trace loop; says each hanging lock once through `notify`."""

    def __init__(self, env: dict[str, str], events: Path | None, notify: Callable[[str], None],
                 said: tuple[BuildLock, ...] = ()) -> None:
        self.events, self.notify = events, notify
        self.watch = LockWatch(env, said=said)
        self.t0 = time.monotonic()
        self.last = self.t0 - self.watch.interval_s          # the first tick looks at once
        self.done = False

    def tick(self) -> None:
        now = time.monotonic()
        if self.done or now - self.last < self.watch.interval_s:     # the event files are read at the watch's pace
            return
        self.last = now
        elapsed_s = now - self.t0
        if self.events is not None and completed_steps(self.events) >= 1:
            self.done = True            # training runs: the job's ops are loaded
            return
        if self.events is None and elapsed_s < NO_HOOK_AFTER_S:
            return
        for lock in self.watch.poll():
            self.notify("iotune: " + hang_note(lock, self._context(lock.op, elapsed_s)))

    def _context(self, op: str, elapsed_s: float) -> str:
        if self.events is not None:
            return (f"The traced job has not completed a training step after {elapsed_s:.0f} s: if it loads "
                    f"{op}, it is waiting on this lock.")
        return f"The traced command has run {elapsed_s:.0f} s: if it loads {op}, it is waiting on this lock."


def seen_stale(env: dict[str, str]) -> tuple[BuildLock, ...]:
    """Stale locks already named before the start (not said again)."""
    return tuple(stale_locks(env))
