"""This host's memory facts: /proc/meminfo fields, ulimit -l and whether
this process may lock memory beyond it (what DeepSpeed's mlock'd swap
buffers meet). Read by doctor, lint and the offload sweep alike."""

from __future__ import annotations

import os
import resource

from .proc import CAP_IPC_LOCK, has_cap


def ram_bytes(field: str = "MemTotal") -> int | None:
    """/proc/meminfo's `field` (MemTotal, MemAvailable, Dirty, ...) in bytes."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memlock_bytes() -> int | None:
    """ulimit -l (RLIMIT_MEMLOCK's soft limit) in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def can_lock_unlimited() -> bool:
    """Whether this process may lock memory beyond ulimit -l (CAP_IPC_LOCK; root)."""
    try:
        return has_cap(CAP_IPC_LOCK)
    except OSError:
        return os.geteuid() == 0
