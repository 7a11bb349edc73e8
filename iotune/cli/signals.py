"""How iotune is stopped: Ctrl-C (SIGINT) and a scheduler's or `kill`'s
SIGTERM both raise KeyboardInterrupt in the main thread, so every
ExitStack unwinds (drives, mounts and cgroups are torn down) and the
command ends with 130.

Python drops an exception raised where it cannot propagate: in a hook
that os.fork runs (logging registers some, and subprocess runs them for
every child started with a preexec_fn), in __del__, in a weakref callback,
in sys.unraisablehook itself. It prints "Exception ignored in …" and goes
on, and the stop would be lost: the command would run to its end. So a
stop that lands in a fork hook is put off, and one dropped anywhere else
is taken again: a timer (SIGALRM, a few milliseconds) delivers it anew
once Python runs outside the hook. Sending the signal again at once
(signal.raise_signal, os.kill, _thread.interrupt_main) would not do:
Python handles it before the call returns, inside the same hook."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

AGAIN_S = 0.005
# the hooks logging registers with os.register_at_fork (Python 3.11; 3.12 and later)
_FORK_HOOKS = frozenset({"_acquireLock", "_releaseLock", "_after_at_fork_child_reinit_locks",
                         "_prepareFork", "_afterFork"})
_pending: list[int] = []         # the stop put off, if any


def _swallowed(frame: FrameType | None) -> bool:
    """Would an exception raised in `frame` be dropped?"""
    while frame is not None:
        if frame.f_globals.get("__name__") == "logging" and frame.f_code.co_name in _FORK_HOOKS:
            return True
        if frame.f_code is _unraisable.__code__:
            return True
        frame = frame.f_back
    return False


def stop(signum: int, frame: FrameType | None) -> None:
    """The handler for SIGINT and SIGTERM."""
    if _swallowed(frame):
        _later(signum)
        return
    if _pending:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _pending.clear()
    raise KeyboardInterrupt


def _later(signum: int) -> None:
    _pending[:] = [signum]
    signal.setitimer(signal.ITIMER_REAL, AGAIN_S)


def _again(_signum: int, frame: FrameType | None) -> None:
    if _pending:
        stop(_pending[0], frame)


def _unraisable(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _later(signal.SIGINT)        # a stop, not an error: nothing to print
    else:
        _default_unraisable(unraisable)


_default_unraisable = sys.unraisablehook


def settle() -> None:
    """At the end of the command: a stop still put off came too late to
    change anything; its timer must not outlive the handler (SIGALRM's
    default action would end the process)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    _pending.clear()


def install() -> None:
    """Take SIGINT and SIGTERM. SIGINT is taken even where iotune was handed
    it ignored: a shell script that runs a command in the background does
    that, and Python then leaves it ignored."""
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGALRM, _again)
    sys.unraisablehook = _unraisable
