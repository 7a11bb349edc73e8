"""Running the traced command: as the invoking user under sudo, exit status
passed through shell-style, signals forwarded."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..host.cgroup import join_cgroup_preexec
from ..errors import CommandNotExecutable, CommandNotFound, UsageError


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int
    user: str
    home: str
    groups: tuple[int, ...]


def sudo_user() -> RunAs | None:
    """The user who ran `sudo iotune ...`, if that is how we were started."""
    name = os.environ.get("SUDO_USER")
    if os.geteuid() != 0 or not name or name == "root":
        return None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return RunAs(pw.pw_uid, pw.pw_gid, name, pw.pw_dir, tuple(os.getgrouplist(name, pw.pw_gid)))


def start(argv: list[str], run_as: RunAs | None, stdout_to_stderr: bool,
          cgroup: str | None = None, env: dict[str, str] | None = None,
          log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start the traced command. With `cgroup` (a cgroup v1 directory), the
    child joins it before exec, so all of its I/O is governed by it. With
    `log`, its stdout and stderr go to that file (made anew) instead of going
    to ours (`stdout_to_stderr` then does not matter).

    Interactive (stdin is a terminal): the child shares our process group, so
    Ctrl-C reaches it and everything it started, as without iotune. Otherwise
    (batch jobs, schedulers, CI) it gets a process group of its own, and
    signals sent to iotune are forwarded to that whole group."""
    if not argv:
        raise UsageError("no command given: use `iotune trace -- CMD ARGS...` or `--duration S`")
    exe = argv[0]
    if "/" not in exe and shutil.which(exe) is None:
        raise CommandNotFound(f"command not found: {exe} (check the name, or give its full path)")
    kwargs: dict[str, object] = {}
    if run_as is not None:
        env = dict(env or os.environ, HOME=run_as.home, USER=run_as.user, LOGNAME=run_as.user)
        kwargs = {"user": run_as.uid, "group": run_as.gid, "extra_groups": list(run_as.groups)}
    if not os.isatty(0):
        kwargs["process_group"] = 0
    if cgroup is not None:
        kwargs["preexec_fn"] = join_cgroup_preexec(cgroup)
    try:
        if log is not None:
            with log.open("wb") as out:
                return subprocess.Popen(argv, env=env, stdout=out, stderr=out, **kwargs)  # type: ignore[call-overload]
        return subprocess.Popen(
            argv, env=env, stdout=2 if stdout_to_stderr else None, **kwargs  # type: ignore[call-overload]
        )
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {exe} (check the name, or give its full path)") from None
    except PermissionError:
        raise CommandNotExecutable(f"cannot execute {exe}: permission denied (is it executable?)") from None


def exit_status(returncode: int) -> int:
    """Shell-style status: a child killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Interrupts:
    """SIGINT/SIGTERM handling while a child runs.

    The first signal is passed on (SIGINT as SIGINT, SIGTERM as SIGTERM), a
    second one sends SIGTERM and a third SIGKILL. When the child shares our
    process group a terminal's Ctrl-C has already reached it, so SIGINT is
    passed on only if the child is still running a second later.
    """

    def __init__(self) -> None:
        self.count = 0
        self.first_at = 0.0
        self.pending_int = False
        self.child: subprocess.Popen[bytes] | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def _own_group(self) -> bool:
        child = self.child
        try:
            return child is not None and os.getpgid(child.pid) == child.pid
        except ProcessLookupError:
            return False

    def _send(self, sig: int) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        try:
            if self._own_group():
                os.killpg(child.pid, sig)
            else:
                child.send_signal(sig)
        except ProcessLookupError:
            pass

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1:
            self.first_at = time.monotonic()
            if signum == signal.SIGINT and not self._own_group():
                self.pending_int = True     # the terminal sent it to the child too
            else:
                self._send(signum)
        else:
            self._send(signal.SIGTERM if self.count == 2 else signal.SIGKILL)

    def tick(self) -> None:
        """Called from the wait loop: pass on a SIGINT the child did not get."""
        if self.pending_int and time.monotonic() - self.first_at > 1.0:
            self.pending_int = False
            self._send(signal.SIGINT)
