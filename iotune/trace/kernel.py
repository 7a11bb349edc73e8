"""What the kernel side needs before a probe can load: privileges, tracefs,
the kernel features the probe uses (KERNEL_FEATURES: BTF, the block
tracepoints), kernel headers for bcc, and bcc itself. The probe's load path
and `iotune doctor` both use the tables and `*_problem` functions here, so
they cannot disagree. Each `require_*` raises an IotuneError that says how
to fix it."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Self

from ..host.proc import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, effective_caps, has_cap, not_installed, run
from ..errors import IotuneError, PrivilegeError, ProbeError

TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
SYSTEM_BCC = Path("/usr/lib/python3/dist-packages/bcc")
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
# The tracepoints probes/blockio.c attaches (RAW_TRACEPOINT_PROBE), in its order, all required.
BLOCK_TRACEPOINTS = ("block_rq_issue", "block_rq_insert", "block_rq_merge", "block_rq_complete", "block_rq_requeue")


@dataclass(frozen=True)
class KernelFeature:
    """A kernel feature the block probe cannot load without."""

    name: str                                          # as `iotune doctor` shows it
    problem: Callable[[Path | None], str | None]       # tracefs events dir -> None, or what is wrong
    fix: str
    present: str                                       # what doctor shows when it is there
    needs_tracefs: bool = False                        # checkable only with tracefs mounted


def btf_problem(events: Path | None = None) -> str | None:
    if VMLINUX_BTF.is_file():
        return None
    return f"no {VMLINUX_BTF}: the probe takes struct request's layout from the kernel's BTF"


def tracepoints_problem(events: Path | None) -> str | None:
    if events is None:
        return "tracefs is not mounted, so the block tracepoints cannot be checked"
    missing = [t for t in BLOCK_TRACEPOINTS if not (events / "block" / t / "format").exists()]
    return f"missing block:{', block:'.join(missing)}" if missing else None


# What `trace --app` (probes/appio.c) attaches, by category; optional: only --app needs them.
APP_TRACEPOINTS = (
    ("sched", "sched_process_exit"),
    ("syscalls", "sys_enter_read"), ("syscalls", "sys_exit_read"),
    ("syscalls", "sys_enter_pwrite64"), ("syscalls", "sys_exit_pwrite64"),
    ("syscalls", "sys_enter_io_submit"), ("syscalls", "sys_exit_io_submit"),
    ("syscalls", "sys_enter_io_getevents"), ("syscalls", "sys_exit_io_getevents"),
    ("io_uring", "io_uring_submit_req"), ("io_uring", "io_uring_complete"),
)


def app_tracepoints_problem(events: Path | None) -> str | None:
    if events is None:
        return "tracefs is not mounted, so the application probe's tracepoints cannot be checked"
    missing = [f"{c}:{t}" for c, t in APP_TRACEPOINTS if not (events / c / t / "format").exists()]
    return f"missing {', '.join(missing)}" if missing else None


KERNEL_FEATURES = (
    KernelFeature("BTF", btf_problem,
                  "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default in major distributions)",
                  str(VMLINUX_BTF)),
    KernelFeature("block tracepoints", tracepoints_problem,
                  "use a kernel with block tracepoints (CONFIG_BLK_DEV_IO_TRACE, CONFIG_BPF_EVENTS)",
                  ", ".join(BLOCK_TRACEPOINTS), needs_tracefs=True),
)


def require_kernel_features(events: Path | None) -> None:
    """Raise ProbeError for the first missing KERNEL_FEATURES entry."""
    for feature in KERNEL_FEATURES:
        problem = feature.problem(events)
        if problem:
            raise ProbeError(f"the block probe cannot load: {problem}; {feature.fix}")


def missing_privileges(caps: int | None = None) -> str | None:
    """None when this process may load and attach BPF tracepoint programs,
    else the name of what is missing."""
    caps = effective_caps() if caps is None else caps
    if has_cap(CAP_SYS_ADMIN, caps):
        return None
    need = [n for n, b in (("CAP_BPF", CAP_BPF), ("CAP_PERFMON", CAP_PERFMON)) if not has_cap(b, caps)]
    return " and ".join(need) or None


def require_privileges() -> None:
    missing = missing_privileges()
    if missing:
        raise PrivilegeError(
            f"tracing needs root (or {missing}) to load BPF programs: "
            f"run it with sudo, e.g. `sudo iotune trace -- CMD`"
        )


def tracefs_events() -> Path | None:
    for d in TRACEFS_DIRS:
        if (d / "events" / "block").is_dir():
            return d / "events"
    return None


def ensure_tracefs() -> Path:
    """The tracefs events directory, mounting tracefs (and debugfs) if needed."""
    found = tracefs_events()
    if found:
        return found
    for fstype, target in (("tracefs", "/sys/kernel/tracing"), ("debugfs", "/sys/kernel/debug")):
        if Path(target).is_dir() and not os.path.ismount(target):
            with contextlib.suppress(IotuneError):     # not found afterwards: the error below
                run(["mount", "-t", fstype, "nodev", target])
        found = tracefs_events()
        if found:       # debugfs only when tracefs alone did not do
            return found
    raise ProbeError(
        "tracefs is not mounted and could not be mounted: run "
        "`mount -t tracefs nodev /sys/kernel/tracing` (needs a kernel with CONFIG_FTRACE)"
    )


def headers_dir() -> Path | None:
    base = Path("/lib/modules") / platform.release()
    for sub in ("build", "source"):
        if (base / sub / "include" / "linux" / "kconfig.h").exists():
            return base / sub
    return None


def require_headers() -> None:
    if headers_dir() is None:
        raise ProbeError(
            f"bcc cannot compile probes: kernel headers for {platform.release()} not found "
            f"in /lib/modules/{platform.release()}/build; run `iotune doctor --fix` "
            f"or install linux-headers (scripts/setup.sh does both)"
        )


def import_bcc() -> ModuleType:
    """Import Debian's bcc bindings (after tracefs is mounted: bcc reads the
    tracefs location once, at import)."""
    ensure_tracefs()
    try:
        return importlib.import_module("bcc")
    except ImportError:
        hint = (
            f"link it into this Python: `iotune doctor --fix` (or "
            f"ln -s {SYSTEM_BCC} $(python -c 'import site; print(site.getsitepackages()[0])')/bcc)"
            if SYSTEM_BCC.is_dir()
            else f"{not_installed('python3-bpfcc')} (the PyPI package named bcc is unrelated)"
        )
        raise ProbeError(f"the bcc Python bindings are not importable: {hint}") from None


class BpfProgram:
    """A bcc program loaded into `self.bpf`: cleaned up (probes detached,
    maps freed) by `close`, also on leaving a `with` block or when loading
    failed halfway."""

    bpf: Any = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
