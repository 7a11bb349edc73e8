"""Running system commands, the one way iotune does it: an argument list,
stdout and stderr kept apart, a clear IotuneError naming the fix when the
command is missing or fails, and process groups that are always killed and
reaped (timeout, error, Ctrl-C) so nothing is left holding the drive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import IotuneError

SETUP_HINT = "run scripts/setup.sh or `iotune doctor --fix`"


def not_installed(tool: str) -> str:
    """The one wording for a missing program."""
    return f"{tool} is not installed: {SETUP_HINT}"


def last_line(text: str | bytes, empty: str = "(nothing)") -> str:
    """The last non-blank line of a program's output (usually its error)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else empty


def tail_lines(path: Path, n: int, max_bytes: int = 256 << 10) -> list[str]:
    """The last `n` lines of a log file (read from its last `max_bytes`);
    [] when it is missing or empty."""
    try:
        with path.open("rb") as fh:
            start = max(0, path.stat().st_size - max_bytes - 1)
            fh.seek(start)
            data = fh.read()
    except FileNotFoundError:
        return []
    if start > 0:                  # what precedes the first newline is a part of a line (or nothing)
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    lines = data.decode(errors="replace").splitlines()
    return lines[-n:] if n > 0 else []


def run(argv: list[str], timeout_s: float | None = None) -> str:
    """Run a system command to completion; its stdout, or IotuneError saying
    what failed (the command line and its last line of stderr)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout_s)
    except FileNotFoundError:
        raise IotuneError(not_installed(argv[0])) from None
    except subprocess.TimeoutExpired:
        raise IotuneError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    if out.returncode != 0:
        raise IotuneError(f"`{' '.join(argv)}` failed: {last_line(out.stderr or out.stdout, 'no message')}")
    return out.stdout


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:  # type: ignore[type-arg]
    """Signal the process group a child leads (started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def terminate(proc: subprocess.Popen, grace_s: float, group: bool = False) -> bool:  # type: ignore[type-arg]
    """SIGTERM to `proc` (with `group`, to the process group it leads), then
    SIGKILL if it is still running after `grace_s`; it is reaped either way.
    True if it had to be killed."""
    killed = False
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            break
        killed = sig == signal.SIGKILL
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
    return killed


def kill_session(sid: int, sig: int = signal.SIGKILL, wait_s: float = 5.0) -> int:
    """Signal every process of session `sid` (a child started with
    start_new_session leads one): also those that moved to process groups of
    their own, such as the compilers ninja starts for a DeepSpeed op build,
    which a group kill misses. Waits up to `wait_s` for them to be gone (a
    killed process lingers until the kernel tears it down), so what runs next
    does not meet them. Returns how many were signalled."""
    hit = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the fields after the ")" closing the command name: state ppid pgrp session ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                os.kill(int(stat.parent.name), sig)
                hit.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    deadline = time.monotonic() + wait_s
    while hit and time.monotonic() < deadline and any(running(pid) for pid in hit):
        time.sleep(0.02)
    return len(hit)


def running(pid: int) -> bool:
    """Alive and not yet a zombie (a zombie has exited; only its parent's wait is missing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


WATCH_EVERY_S = 0.5


def communicate_watching(proc: subprocess.Popen, timeout_s: float | None,  # type: ignore[type-arg]
                         watch: Callable[[], None] | None) -> tuple[Any, Any]:
    """proc.communicate(timeout=timeout_s), calling `watch` every
    WATCH_EVERY_S meanwhile (what it raises propagates; the caller kills)."""
    if watch is None:
        return proc.communicate(timeout=timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = WATCH_EVERY_S if deadline is None else min(WATCH_EVERY_S, max(0.0, deadline - time.monotonic()))
        try:
            return proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout_s or 0) from None
            watch()


def run_in_own_group(argv: list[str], timeout_s: float | None, preexec_fn: Callable[[], None] | None = None,
                     env: dict[str, str] | None = None, text: bool = True,
                     watch: Callable[[], None] | None = None) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """Run argv as the leader of a new process group, capturing stdout and
    stderr. On timeout or any interruption (Ctrl-C included) the whole group
    is killed and reaped before the exception propagates. `watch` is called
    every WATCH_EVERY_S while it runs: an exception it raises ends the run
    the same way (e.g. oplocks.BuildLockHang)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, env=env,
                            start_new_session=True, preexec_fn=dying_with_us(preexec_fn))
    try:
        out, err = communicate_watching(proc, timeout_s, watch)
    except BaseException:
        kill_group(proc)
        kill_session(proc.pid)
        proc.wait()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


PR_SET_PDEATHSIG = 1


def dying_with_us(then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A preexec_fn: the child is SIGKILLed by the kernel when the thread that
    started it dies, SIGKILL included (prctl PR_SET_PDEATHSIG), so a helper
    iotune runs (fio, a trial) never outlives it; then `then`. A parent gone
    before the prctl took hold is caught by its pid."""
    import ctypes

    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        if then is not None:
            then()
    return preexec


def process_memory(pid: int | str = "self") -> dict[str, int]:
    """A process's memory from /proc/PID/status, in bytes: `locked_bytes`
    (VmLck: mlock'd pages, where DeepSpeed's swap buffers live), `rss_bytes`
    (VmRSS) and `peak_rss_bytes` (VmHWM); {} when the process is gone."""
    names = {"VmLck:": "locked_bytes", "VmRSS:": "rss_bytes", "VmHWM:": "peak_rss_bytes"}
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, *rest = line.split()
                if key in names and rest:
                    out[names[key]] = int(rest[0]) * 1024          # the kernel reports kB (KiB)
    except OSError:
        return {}
    return out


CAP_SYS_ADMIN, CAP_IPC_LOCK, CAP_PERFMON, CAP_BPF = 21, 14, 38, 39


def effective_caps() -> int:
    """This process's effective capability bits (/proc/self/status CapEff)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def has_cap(bit: int, caps: int | None = None) -> bool:
    return bool((effective_caps() if caps is None else caps) & (1 << bit))


def prefer_interpreter_tools(env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Put this interpreter's bin directory first on PATH (in place).

    DeepSpeed builds its C++ ops with whatever `ninja` PATH finds. A venv
    carries its own (pip's ninja 1.13) while Debian may have another (1.11);
    each rewrites the other's build log in ~/.cache/torch_extensions, so
    alternating between them rebuilds async_io and cpu_adam (minutes each).
    Every process iotune starts that loads DeepSpeed ops calls this first.
    That matters only for a DeepSpeed without prebuilt ops: scripts/setup.sh
    installs it with them compiled in, and then no ninja runs at all."""
    here = os.path.dirname(os.path.abspath(sys.executable))
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != here]
    env["PATH"] = os.pathsep.join([here, *parts])
