"""One command running on a node through a transport (ssh, srun), as a local
process: the one way the multi-node trace's agents and the multi-node
sweep's nodes are started, read and stopped.

Its stdout is kept whole, in memory, by a reader thread (an agent's ready
line and run, a node's JSON outcome), with the times its first line and its
end arrived. Its stderr is read line by line: each line can be passed on
(`say`, with the host in front), and the last few are kept so the transport
can pick the one that says what went wrong. The process leads its own
session; `kill` stops it with SIGTERM first (srun cancels its step on the
node; a SIGKILLed srun would leave the step running), and leaves nothing of
its session behind.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from ..host.proc import kill_session, last_line, terminate
from .ssh import Transport

Say = Callable[[str], None]
P = TypeVar("P", bound="RemoteProcess")
TAIL_LINES = 20          # stderr lines kept for the error message
KILL_GRACE_S = 3.0       # SIGTERM, then SIGKILL after this


class RemoteProcess:
    """`remote_argv` running on `host` through `transport`; `stdin=True`
    keeps a pipe to it open (closing it is the agents' stop signal),
    otherwise it reads /dev/null."""

    def __init__(self, host: str, remote_argv: Sequence[str], transport: Transport, *,
                 say: Say | None = None, stdin: bool = False) -> None:
        self.host = host
        self.transport = transport
        self._say = say
        self._out = bytearray()
        self._tail: list[str] = []
        self.started_at = time.monotonic()
        self.first_line_at: float | None = None    # when stdout's first newline arrived
        self.eof_at: float | None = None           # when stdout ended
        self.proc = subprocess.Popen(transport.argv(host, remote_argv),
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._readers:
            t.start()

    @classmethod
    @contextlib.contextmanager
    def running(cls: type[P], *args: Any, **kwargs: Any) -> Iterator[P]:
        """Started here (with the class's own arguments), killed and reaped
        on the way out, whatever happens."""
        p = cls(*args, **kwargs)
        try:
            yield p
        finally:
            p.kill()

    def _read_stdout(self) -> None:
        if self.proc.stdout is None:        # always a pipe here; for the type checker
            return
        fd = self.proc.stdout.fileno()
        with contextlib.suppress(OSError):      # closed by kill() under a reader still waiting
            while chunk := os.read(fd, 1 << 16):
                self._out += chunk
                if self.first_line_at is None and b"\n" in chunk:
                    self.first_line_at = time.monotonic()
        self.eof_at = time.monotonic()

    def _read_stderr(self) -> None:
        if self.proc.stderr is None:        # always a pipe here; for the type checker
            return
        with contextlib.suppress(OSError, ValueError):      # closed by kill() under a reader still waiting
            for raw in iter(self.proc.stderr.readline, b""):
                line = last_line(raw.decode(errors="replace"), "")
                if line:
                    self._tail = [*self._tail[1 - TAIL_LINES:], line]
                    if self._say is not None:
                        self._say(f"{self.host}: {line}")

    def _settle(self) -> None:
        """Once the process has exited, let the readers take in what it wrote last."""
        if self.proc.poll() is not None:
            for t in self._readers:
                t.join(5)

    @property
    def stdout(self) -> bytes:
        """What it wrote to stdout so far (all of it, once it has exited)."""
        self._settle()
        return bytes(self._out)

    @property
    def last(self) -> str:
        """The stderr line that says what went wrong (the transport's pick)."""
        self._settle()
        return self.transport.last_message("\n".join(self._tail))

    @property
    def exited(self) -> bool:
        return self.proc.poll() is not None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def wait(self, timeout_s: float | None) -> int | None:
        """The exit status once both streams are read; None: still running at
        the timeout, and then killed."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        for t in self._readers:
            t.join(5)
        return code

    def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def kill(self, grace_s: float = KILL_GRACE_S) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; then SIGKILL
        to whatever of its session is left (a child that ignored SIGTERM, or
        moved to a group of its own). Reaped, its streams read to their end
        and closed."""
        terminate(self.proc, grace_s, group=True)
        kill_session(self.proc.pid)
        for t in self._readers:
            t.join(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
