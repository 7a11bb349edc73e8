"""A stop (SIGINT, SIGTERM) is never lost: where Python would drop the
KeyboardInterrupt (a fork hook, __del__), it is taken again once Python
runs outside. Each case runs in its own interpreter with iotune's
handlers, and fails as "ran on" without them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

WAIT_S = 60        # the bound on the wait the stop must end (it ends in milliseconds)

HEAD = textwrap.dedent("""\
    import logging, signal, subprocess, sys, threading
    from iotune.cli import signals
    signals.install()
    """)
TAIL = textwrap.dedent(f"""\
    try:
        try:
            {{body}}
            threading.Event().wait({WAIT_S})
        except KeyboardInterrupt:
            print("stopped")
            sys.exit(130)
        print("ran on")
    finally:
        signals.settle()
    """)

# logging's lock, taken in the hook os.fork runs before a child with a
# preexec_fn starts: the signal lands inside the hook, as it did when a
# sweep was stopped while it started fio
IN_A_FORK_HOOK = HEAD + textwrap.dedent("""\
    class Lock:
        def __init__(self, real):
            self.real, self.armed = real, True
        def acquire(self, *a):
            if self.armed:
                self.armed = False
                signal.raise_signal(signal.SIGTERM)
            return self.real.acquire(*a)
        def release(self):
            self.real.release()
        def _at_fork_reinit(self):
            self.real._at_fork_reinit()
    logging._lock = Lock(logging._lock)
    """) + TAIL.format(body='subprocess.run(["true"], preexec_fn=lambda: None)')

IN_DEL = HEAD + textwrap.dedent("""\
    class Dropped:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)
    """) + TAIL.format(body="Dropped()")


@pytest.mark.parametrize("script", [IN_A_FORK_HOOK, IN_DEL], ids=["in a fork hook", "in __del__"])
def test_a_stop_where_python_drops_the_exception_still_stops(script: str) -> None:
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT_S + 30)
    assert (run.returncode, run.stdout.strip()) == (130, "stopped"), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_a_stop_elsewhere_is_taken_at_once() -> None:
    run = subprocess.run([sys.executable, "-c", HEAD + TAIL.format(body="signal.raise_signal(signal.SIGTERM)")],
                         capture_output=True, text=True, timeout=WAIT_S + 30)
    assert (run.returncode, run.stdout.strip(), run.stderr) == (130, "stopped", "")
