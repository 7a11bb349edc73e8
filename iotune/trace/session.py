"""One trace: attach the probe, run a command (or wait a window), collect a
TraceRun. The run is assembled even when the command fails or is interrupted."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import tempfile
import platform
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from .. import __version__
from ..blockdev.devices import BlockDevice, describe, lower_devices, name_for_kdev, size_bytes
from ..host.ledger import note, opened_ledger, private_tmp, temp_dir
from ..opbuild.oplocks import BuildLock
from ..blockdev.targets import queue_limits
from ..model.run import DeviceStats, HostInfo, TimelinePoint, TraceRun
from . import child as childproc
from .attribution import inject_env, read_events, read_schedule
from .lockwatch import JobLockWatch, check_before_start, seen_stale
from .appprobe import AppProbe
from .applayer import AppOptions, app_config, app_layer
from .probe import BlockProbe, ProbeConfig

# (elapsed_s, read_bytes, write_bytes, read_requests, write_requests)
Progress = Callable[[float, int, int, int, int], None]


@dataclass(frozen=True)
class TraceOptions:
    devices: tuple[BlockDevice, ...] = ()   # empty: every device
    interval_s: float = 1.0
    run_as: childproc.RunAs | None = None
    stdout_to_stderr: bool = False          # keep stdout clean for --json
    log: Path | None = None                 # the command's stdout and stderr go to this file, not ours
    linger_s: float = 0.0                   # keep tracing after the command ends
    cgroup: str | None = None               # run the command in this cgroup (v1 dir)
    inject: bool = False                    # attribution hooks in Python children
    timeline_entries: int | None = None     # kernel timeline map size (default: the probe's)
    app: AppOptions | None = None           # also trace the application layer (probes/appio.c)
    block: bool = True                      # trace the block layer (False: no block device to trace)


def trace_command(argv: list[str], opts: TraceOptions, progress: Progress | None = None,
                  notify: Callable[[str], None] | None = None) -> TraceRun:
    """Trace `argv` from start to end; returns the run (never raises for a
    failing or interrupted command: that is recorded in the run).

    With `notify` (a status line for the user), a Python command is refused
    (UsageError) on a stale DeepSpeed op-build lock, and a lock the running
    job would wait on forever is named (trace.lockwatch)."""
    started = _utcnow()
    config = _probe_config(opts)
    job_env = _job_env(opts)
    said: tuple[BuildLock, ...] = ()
    if notify is not None:
        warning = check_before_start(argv, job_env)
        if warning:
            notify(warning)
            said = seen_stale(job_env)
    with _probes(config, opts, True) as (probe, app), childproc.Interrupts() as intr, _events_dir(opts) as events, \
            contextlib.ExitStack() as stack:
        env = inject_env(dict(os.environ), events) if events else None
        if opened_ledger() is not None and opts.run_as is None:     # iotune's own run (the demo's)
            env = private_tmp(env or dict(os.environ), temp_dir(stack, "iotune-run-"))
        proc = _start(argv, opts, env, app)
        intr.child = proc
        locks = JobLockWatch(job_env, events, notify, said) if notify is not None else None
        t0 = time.monotonic()
        while proc.poll() is None:
            _wait(proc, 0.2)
            intr.tick()
            _tick(probe, app, t0, progress)
            if locks is not None:
                locks.tick()
        _linger(opts.linger_s, intr)
        duration = time.monotonic() - t0
        status = childproc.exit_status(proc.returncode)
        outcome = "interrupted" if intr.interrupted else ("completed" if status == 0 else "failed")
        run = _assemble(probe, app, opts, started, duration, tuple(argv), status, outcome)
        return replace(run, clock_origin_ns=config.t0_ns, attribution=read_events(events) if events else None,
                       swap_schedule=read_schedule(events) if events else None)


def _job_env(opts: TraceOptions) -> dict[str, str]:
    """The environment the command gets, as far as where torch builds ops goes."""
    env = dict(os.environ)
    if opts.run_as is not None:
        env["HOME"] = opts.run_as.home
    return env


def _start(argv: list[str], opts: TraceOptions, env: dict[str, str] | None,
           app: AppProbe | None) -> subprocess.Popen[bytes]:
    """The command, its processes traced by the application probe: what this
    process forks while starting it is traced, nothing it forks later."""
    if app is not None:
        app.launcher(os.getpid())
    try:
        return childproc.start(argv, opts.run_as, opts.stdout_to_stderr, opts.cgroup, env, opts.log)
    finally:
        if app is not None:
            app.launched(os.getpid())


@contextlib.contextmanager
def _probes(config: ProbeConfig, opts: TraceOptions,
            proc_filter: bool) -> Iterator[tuple[BlockProbe | None, AppProbe | None]]:
    """The block probe (unless opts.block is off) and the application probe
    (with opts.app), attached; detached on leaving."""
    with contextlib.ExitStack() as stack:
        block = stack.enter_context(BlockProbe(config)) if opts.block else None
        app = stack.enter_context(AppProbe(app_config(opts.app, proc_filter))) if opts.app else None
        yield block, app


def trace_window(duration_s: float, opts: TraceOptions, progress: Progress | None = None) -> TraceRun:
    """Trace every selected device for `duration_s` seconds (or until Ctrl-C)."""
    started = _utcnow()
    with _probes(_probe_config(opts), opts, False) as (probe, app), childproc.Interrupts() as intr:
        t0 = time.monotonic()
        while not intr.interrupted and time.monotonic() - t0 < duration_s:
            time.sleep(min(0.2, max(0.0, duration_s - (time.monotonic() - t0))))
            _tick(probe, app, t0, progress)
        duration = time.monotonic() - t0
        outcome = "interrupted" if intr.interrupted else "window"
        return _assemble(probe, app, opts, started, duration, (), None, outcome)


def trace_until(ready: Callable[[], None], stopped: Callable[[float], bool], opts: TraceOptions,
                command: tuple[str, ...] = ()) -> TraceRun:
    """Trace until `stopped(timeout_s)` says so (it may block that long),
    SIGINT or SIGTERM; `ready()` is called once the probe is attached. The
    run's outcome is "completed", or "interrupted" after a signal. A
    multi-node trace's agent runs this (trace.agent)."""
    started = _utcnow()
    config = _probe_config(opts)
    with BlockProbe(config) as probe, childproc.Interrupts() as intr:
        ready()
        t0 = time.monotonic()
        while not intr.interrupted and not stopped(0.2):
            _tick(probe, None, t0, None)
        duration = time.monotonic() - t0
        outcome = "interrupted" if intr.interrupted else "completed"
        run = _assemble(probe, None, opts, started, duration, command, None, outcome)
        return replace(run, clock_origin_ns=config.t0_ns)


@contextlib.contextmanager
def _events_dir(opts: TraceOptions) -> Iterator[Path | None]:
    """A private directory for the hooks' event files, removed afterwards."""
    if not opts.inject:
        yield None
        return
    with contextlib.ExitStack() as stack:
        path = Path(tempfile.mkdtemp(prefix="iotune-events-"))
        if opened_ledger() is not None:       # a run iotune owns (the demo's): a hard kill reclaims it too
            note(stack, "dir", path=path.resolve())
        stack.callback(shutil.rmtree, path, True)
        if opts.run_as is not None:
            os.chown(path, opts.run_as.uid, opts.run_as.gid)
        yield path


def _probe_config(opts: TraceOptions) -> ProbeConfig:
    return ProbeConfig(devices=opts.devices, interval_ns=int(opts.interval_s * 1e9),
                       t0_ns=time.monotonic_ns(), timeline_entries=opts.timeline_entries)


def _wait(proc: object, timeout: float) -> None:
    try:
        proc.wait(timeout)  # type: ignore[attr-defined]
    except Exception:   # TimeoutExpired, or EINTR surfacing from a signal
        pass


def _tick(probe: BlockProbe | None, app: AppProbe | None, t0: float, progress: Progress | None) -> None:
    if app is not None:
        app.tick()
    if probe is None:
        return
    probe.drain_timeline()
    if progress is not None:
        rr, rb, wr, wb = probe.live_totals()
        progress(time.monotonic() - t0, rb, wb, rr, wr)


def _linger(linger_s: float, intr: childproc.Interrupts) -> None:
    end = time.monotonic() + linger_s
    while not intr.interrupted and time.monotonic() < end:
        time.sleep(min(0.1, end - time.monotonic()))


def _assemble(probe: BlockProbe | None, app: AppProbe | None, opts: TraceOptions, started: str,
              duration: float, argv: tuple[str, ...], status: int | None, outcome: str) -> TraceRun:
    run = _assemble_block(probe, opts, started, duration, argv, status, outcome)
    if app is None or opts.app is None:
        return run
    return replace(run, app=app_layer(app, opts.app))


def _assemble_block(probe: BlockProbe | None, opts: TraceOptions, started: str, duration: float,
                    argv: tuple[str, ...], status: int | None, outcome: str) -> TraceRun:
    per_dev = probe.collect() if probe is not None else {}
    names = {kdev: name_for_kdev(kdev) for kdev in per_dev}
    lower_of: dict[str, list[str]] = {}
    for dev in names.values():
        for low in lower_devices(dev):
            if low.kdev in names:
                lower_of.setdefault(low.name, []).append(dev.name)
    devices = tuple(
        DeviceStats(major=d.major, minor=d.minor, name=d.name, directions=per_dev[kdev],
                    lower_of=tuple(lower_of.get(d.name, ())), description=describe(d),
                    size_bytes=size_bytes(d), **_limits(d.name))
        for kdev, d in sorted(names.items(), key=lambda x: x[1].name)
    )
    timeline = tuple(
        TimelinePoint(round(bucket * opts.interval_s, 6), names[kdev].name if kdev in names
                      else name_for_kdev(kdev).name, op, req, nbytes)
        for kdev, op, bucket, req, nbytes in (probe.timeline() if probe is not None else ())
    )
    return TraceRun(
        run_id=uuid.uuid4().hex[:12], started_at=started, duration_s=round(duration, 6),
        interval_s=opts.interval_s, command=argv, exit_status=status, outcome=outcome,
        device_filter=tuple(d.name for d in opts.devices), devices=devices,
        timeline=timeline, drops=probe.drops() if probe is not None else {}, host=_host(),
    )


def _limits(name: str) -> dict[str, int]:
    q = queue_limits(name)
    return {"max_sectors_kb": q.max_sectors_kb, "max_segments": q.max_segments,
            "max_segment_size": q.max_segment_size}


def _host() -> HostInfo:
    try:
        import bcc   # already imported by the probe
        bcc_version = getattr(bcc, "__version__", "")
    except ImportError:
        bcc_version = ""
    return HostInfo(kernel=platform.release(), hostname=socket.gethostname(),
                    iotune_version=__version__, bcc_version=bcc_version)


def _utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
