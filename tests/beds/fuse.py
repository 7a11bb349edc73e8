"""The FUSE bed, which only tests bring up: the emulated drive's daemon
(iotune/volumes/fusedrive/latency_drive.c) in tree mode, mounted directly
at a path with no loop device on top. It stands in for a network filesystem (Lustre, NFS, a FUSE client) as a
DeepSpeed swap path: there is no block device under it, O_DIRECT works
(every file is opened with direct_io), and every read and write takes a
known service time with at most `parallelism` in service at once.

    with fuse_bed(tmp_path, DriveLimits(latency_us=200, parallelism=8)) as bed:
        run_job(nvme_path=bed.path)

Everything is undone on exit, error or Ctrl-C: the daemon, the FUSE mount,
and the files written through it (they live in a directory of the bed's own
making, removed with everything in it: nothing outside it is touched)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from iotune.model.drive import DriveLimits
from iotune.volumes.emulated import (DaemonStats, build_daemon, check_request, make_dir, new_drive_dir, read_stats,
                                     start_daemon)
from iotune.volumes.parts import require_root

STATS_FILE = ".iotune-drive-stats"   # TREE_STATS in latency_drive.c


@dataclass(frozen=True)
class FuseBed:
    path: Path            # the mount point: use it as the swap path
    backing: Path         # the directory holding the files
    limits: DriveLimits
    daemon_pid: int

    def stats(self) -> DaemonStats:
        return read_stats(self.path / STATS_FILE)


@contextlib.contextmanager
def fuse_bed(directory: Path | None, limits: DriveLimits, cache_dir: Path | None = None) -> Iterator[FuseBed]:
    """A FUSE filesystem with `limits`, mounted in a fresh directory inside
    `directory` (default: the temporary directory)."""
    require_root("the FUSE bed")
    check_request(4096, limits, None, 512)
    binary = build_daemon(cache_dir)
    with contextlib.ExitStack() as stack:
        bed_dir = new_drive_dir(stack, directory)
        backing = make_dir(stack, bed_dir / "backing")
        stack.callback(_empty_dir, backing)          # runs before the rmdir above
        mount = make_dir(stack, bed_dir / "mnt")
        proc = start_daemon(stack, binary, backing, mount, limits, bed_dir / "daemon.log", tree=True)
        yield FuseBed(mount, backing, limits, proc.pid)


def _empty_dir(path: Path) -> None:
    """Remove what the bed's users wrote into its own backing directory."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
