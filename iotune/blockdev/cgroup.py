"""Running a child process inside a cgroup v1 directory (e.g. a capped
drive's blkio cgroup), shared by trace/ and sweep/."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable


def _join(cgroup: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))


def join_cgroup_preexec(cgroup: str | None) -> Callable[[], None] | None:
    """A subprocess preexec_fn that moves the child into `cgroup` before it
    execs, so all of its I/O is governed by it (None: no cgroup)."""
    return functools.partial(_join, cgroup) if cgroup else None
