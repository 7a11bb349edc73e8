"""What the kernel side needs before a probe can load: privileges, tracefs,
kernel headers for bcc, and bcc itself. Each check raises an IotuneError that
says how to fix it."""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
from pathlib import Path
from types import ModuleType

from ..errors import PrivilegeError, ProbeError

TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
SYSTEM_BCC = Path("/usr/lib/python3/dist-packages/bcc")


def effective_caps() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def missing_privileges(caps: int | None = None) -> str | None:
    """None when this process may load and attach BPF tracepoint programs,
    else the name of what is missing."""
    caps = effective_caps() if caps is None else caps
    if caps & (1 << CAP_SYS_ADMIN):
        return None
    need = [n for n, b in (("CAP_BPF", CAP_BPF), ("CAP_PERFMON", CAP_PERFMON)) if not caps & (1 << b)]
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
            subprocess.run(["mount", "-t", fstype, "nodev", target],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    found = tracefs_events()
    if not found:
        raise ProbeError(
            "tracefs is not mounted and could not be mounted: run "
            "`mount -t tracefs nodev /sys/kernel/tracing` (needs a kernel with CONFIG_FTRACE)"
        )
    return found


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
            else "install it: `apt-get install python3-bpfcc` (the PyPI package named bcc is unrelated)"
        )
        raise ProbeError(f"the bcc Python bindings are not importable: {hint}") from None
