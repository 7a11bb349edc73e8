"""Scratch drives: loop devices over files, with direct I/O and an optional
cgroup v1 blkio bandwidth cap, so a run has a known physical limit on any
machine. A scratch drive lives in a directory the user gives (or a fresh
temporary one) and never touches an existing device, so it needs no
destroy flag. Everything is undone on exit, error or Ctrl-C."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..host.cgroup import BLKIO, Throttle, blkio_cgroup
from ..blockdev.devices import BlockDevice
from ..errors import IotuneError
from .parts import MKFS, attach_loop, create_file, format_and_mount, require_root, workdir

__all__ = ["BLKIO", "MKFS", "ScratchDrive", "scratch_drive"]


@dataclass(frozen=True)
class ScratchDrive:
    device: BlockDevice
    image: Path
    cgroup: Path | None        # processes in it are capped to the drive's bandwidth
    mount_point: Path | None   # set when a filesystem was made


@contextlib.contextmanager
def scratch_drive(directory: Path | None = None, size_bytes: int = 1 << 30, cap_bytes_per_s: int = 0,
                  fstype: str | None = None) -> Iterator[ScratchDrive]:
    """A capped loop drive over a file; with `fstype`, also formatted and mounted."""
    require_root("scratch drives")
    with contextlib.ExitStack() as stack:
        where = workdir(stack, directory, "iotune-scratch-")
        image = _create_image(stack, where, size_bytes)
        device = attach_loop(stack, image)
        cgroup = None
        if cap_bytes_per_s:
            cap = Throttle(device.number, read_bps=cap_bytes_per_s, write_bps=cap_bytes_per_s)
            cgroup = stack.enter_context(blkio_cgroup(device.name, [cap]))
        mount_point = format_and_mount(stack, device, where, fstype) if fstype else None
        yield ScratchDrive(device, image, cgroup, mount_point)


def _create_image(stack: contextlib.ExitStack, where: Path, size_bytes: int) -> Path:
    """iotune-drive-<pid>[-n].img, the first name free in `where` (several
    drives may share one directory)."""
    for n in range(1000):
        image = where / (f"iotune-drive-{os.getpid()}.img" if n == 0 else f"iotune-drive-{os.getpid()}-{n}.img")
        try:
            create_file(stack, image, size_bytes)
            return image
        except FileExistsError:
            continue
    raise IotuneError(f"no free image name in {where}: remove old iotune-drive-* files there")
