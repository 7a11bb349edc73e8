"""Prerequisite checks. Each returns a CheckResult; fixes are separate
functions so `--fix` applies only what is safe (mounts, links, apt installs)."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..host import ledger
from ..fs.directio import direct_io_problem
from ..host.proc import not_installed, run
from ..errors import IotuneError
from ..model.checks import CheckResult
from ..trace import kernel
from .opscheck import check_deepspeed_ops

APT_FIX = "apt-get install -y {pkgs}"


def check_privileges() -> CheckResult:
    missing = kernel.missing_privileges()
    if missing:
        return CheckResult("privileges", "fail", f"missing {missing}",
                           "run as root: sudo iotune ...")
    return CheckResult("privileges", "ok", "root (CAP_SYS_ADMIN)" if os.geteuid() == 0 else "CAP_BPF + CAP_PERFMON")


def check_kernel_feature(feature: kernel.KernelFeature) -> CheckResult:
    """One of the kernel features the probe's load path requires (the same
    table and test: kernel.KERNEL_FEATURES)."""
    events = kernel.tracefs_events()
    if feature.needs_tracefs and events is None:
        return CheckResult(feature.name, "skip", "needs tracefs (iotune trace mounts it)")
    problem = feature.problem(events)
    if problem:
        return CheckResult(feature.name, "fail", problem, feature.fix)
    return CheckResult(feature.name, "ok", feature.present)


def check_app_tracepoints() -> CheckResult:
    """What `trace --app` attaches: not required for block tracing, so a warning."""
    name = "app-layer tracepoints"
    events = kernel.tracefs_events()
    if events is None:
        return CheckResult(name, "skip", "needs tracefs (iotune trace mounts it)")
    problem = kernel.app_tracepoints_problem(events)
    if problem:
        return CheckResult(name, "warn", f"{problem}: `iotune trace --app` cannot load (block tracing works)",
                           "use a kernel with syscall tracepoints (CONFIG_FTRACE_SYSCALLS) and io_uring")
    return CheckResult(name, "ok", "syscalls (read/write, libaio), io_uring and sched (for --app)")


def check_tracefs() -> CheckResult:
    ev = kernel.tracefs_events()
    if ev:
        return CheckResult("tracefs", "ok", str(ev.parent))
    return CheckResult("tracefs", "warn", "not mounted (iotune trace mounts it when it starts)",
                       "mount -t tracefs nodev /sys/kernel/tracing", fixable=True)


def check_headers() -> CheckResult:
    d = kernel.headers_dir()
    if d:
        return CheckResult("kernel headers", "ok", str(d.resolve()))
    have = sorted(Path("/usr/src").glob("linux-headers-*-amd64")) if Path("/usr/src").is_dir() else []
    if have:
        return CheckResult("kernel headers", "fail",
                           f"none for {platform.release()}; {have[-1].name} is installed",
                           f"link /lib/modules/{platform.release()}/{{build,source}} to {have[-1]}",
                           fixable=True)
    return CheckResult("kernel headers", "fail", f"none for {platform.release()}",
                       APT_FIX.format(pkgs="linux-headers-amd64"), fixable=True)


def check_bcc_import() -> CheckResult:
    if importlib.util.find_spec("bcc") is not None:
        return CheckResult("bcc importable", "ok", "bcc Python bindings found")
    if kernel.SYSTEM_BCC.is_dir():
        return CheckResult("bcc importable", "fail", "installed for the system Python only",
                           f"link {kernel.SYSTEM_BCC} into this Python's site-packages", fixable=True)
    return CheckResult("bcc importable", "fail", not_installed("python3-bpfcc"),
                       APT_FIX.format(pkgs="python3-bpfcc bpfcc-tools"), fixable=True)


def check_bcc_compile() -> CheckResult:
    from ..trace.probe import BlockProbe, ProbeConfig

    try:
        with BlockProbe(ProbeConfig()):
            pass
    except Exception as e:   # any failure here is the finding
        return CheckResult("bcc compiles probe", "fail", str(e).split(";")[0],
                           "fix the checks above, then rerun `iotune doctor`")
    return CheckResult("bcc compiles probe", "ok", "probes/blockio.c compiled and attached")


def check_fio() -> CheckResult:
    exe = shutil.which("fio")
    if not exe:
        return CheckResult("fio", "fail", not_installed("fio"), APT_FIX.format(pkgs="fio"), fixable=True)
    try:
        version = run([exe, "--version"], timeout_s=30).strip()
    except IotuneError as e:
        return CheckResult("fio", "fail", str(e), APT_FIX.format(pkgs="fio"), fixable=True)
    return CheckResult("fio", "ok", f"{version} ({exe})")


def check_libaio() -> CheckResult:
    if Path("/usr/include/libaio.h").exists():
        return CheckResult("libaio-dev", "ok", "/usr/include/libaio.h (DeepSpeed async_io builds)")
    return CheckResult("libaio-dev", "fail", "libaio.h missing: DeepSpeed's async_io op cannot build",
                       APT_FIX.format(pkgs="libaio-dev"), fixable=True)


def check_blkio_cgroup() -> CheckResult:
    p = Path("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device")
    if p.exists():
        return CheckResult("cgroup v1 blkio", "ok", "throttling available (capped test drives)")
    return CheckResult("cgroup v1 blkio", "warn", "not mounted: capped loop drives unavailable")


def check_loop() -> CheckResult:
    if shutil.which("losetup") is None:
        return CheckResult("loop devices", "warn", not_installed("losetup"), APT_FIX.format(pkgs="mount"))
    if Path("/dev/loop-control").exists():
        return CheckResult("loop devices", "ok", "/dev/loop-control")
    return CheckResult("loop devices", "warn", "no /dev/loop-control: scratch drives unavailable")


def check_direct_io(path: str) -> CheckResult:
    """Can DeepSpeed's swapper do O_DIRECT I/O under `path`?"""
    name = f"O_DIRECT on {path}"
    problem = direct_io_problem(path)
    if problem == "not a directory":
        return CheckResult(name, "fail", problem, "give an existing directory with --path")
    if problem:
        return CheckResult(name, "fail", problem,
                           "put nvme_path on ext4, xfs or btrfs on a block device")
    return CheckResult(name, "ok", "aligned O_DIRECT write and read work")


LEFTOVERS = "leftovers"


def check_leftovers() -> CheckResult:
    """What killed iotune runs left: loop devices, mounts, cgroups, files,
    daemons and processes whose maker is gone (see host/ledger.py)."""
    if os.geteuid() != 0:
        return CheckResult(LEFTOVERS, "skip", "needs root (reads other processes' environments)")
    found = ledger.leftovers()
    lines = [f"{line} [from `{lo.command}`, pid {lo.owner.split('-')[0]}, gone]" for lo in found for line in lo.lines()]
    lines += [f"{e.describe()} [named like an older iotune's, its pid gone]" for e in ledger.unrecorded()]
    if not lines:
        return CheckResult(LEFTOVERS, "ok", "nothing left behind by a killed iotune run", data={"leftovers": 0})
    return CheckResult(LEFTOVERS, "fail", f"{len(lines)} left by iotune runs that were killed: " + "; ".join(lines),
                       "iotune doctor --fix (removes only what iotune made)", fixable=True,
                       data={"leftovers": len(lines)})


CHECKS: tuple[Callable[[], CheckResult], ...] = (
    check_privileges, check_tracefs, *(partial(check_kernel_feature, f) for f in kernel.KERNEL_FEATURES),
    check_app_tracepoints, check_headers,
    check_bcc_import, check_bcc_compile, check_fio, check_libaio, check_blkio_cgroup,
    check_loop, check_deepspeed_ops, check_leftovers,
)


def run_checks(direct_io_path: str | None = None) -> list[CheckResult]:
    results = [c() for c in CHECKS]
    if direct_io_path:
        results.append(check_direct_io(direct_io_path))
    return results
