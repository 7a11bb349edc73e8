"""What `iotune trace --path` points at, for both layers: the filesystem
(its dev_t as the kernel writes it in super_block.s_dev, which the
application probe keys files by) and the block devices under it, if any.
A FUSE, NFS or tmpfs path has none: only the application layer can be
traced there."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..errors import UsageError
from .devices import SYS_BLOCK, BlockDevice, devices_for_path, mount_of, stat_path


@dataclass(frozen=True)
class PathTarget:
    path: str
    kdev: int                            # filesystem dev_t, major << 20 | minor (a device node: the device)
    fstype: str
    source: str
    devices: tuple[BlockDevice, ...]     # block devices under it; empty: none (FUSE, NFS, tmpfs)
    stat_kdev: int = 0                   # st_dev as stat() reports it, when it differs from kdev (btrfs: the
    #                                      subvolume's anonymous device, not the superblock's); 0: the same

    @property
    def has_block_layer(self) -> bool:
        return bool(self.devices)

    def describe(self) -> str:
        """'fuse.iotune iotune-fusebed (0:40)': type, source, device number."""
        return f"{self.fstype} {self.source} ({self.number})"

    @property
    def short_name(self) -> str:
        """'fuse.iotune 0:40': for tables."""
        return f"{self.fstype} {self.number}"

    @property
    def number(self) -> str:
        return f"{self.kdev >> 20}:{self.kdev & 0xFFFFF}"


def kernel_dev(st_dev: int) -> int:
    """A user-space st_dev as the kernel's dev_t (major << 20 | minor)."""
    return os.major(st_dev) << 20 | os.minor(st_dev)


def path_target(path: str) -> PathTarget:
    """The filesystem holding `path` and the block devices under it."""
    st = stat_path(path)
    mnt = mount_of(path)
    seen = kernel_dev(st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
    # the kernel keys a file by its superblock's s_dev, which mountinfo shows; btrfs's stat() reports
    # its subvolume's anonymous device instead
    kdev = seen if stat.S_ISBLK(st.st_mode) else mnt.number[0] << 20 | mnt.number[1]
    try:
        devices = tuple(devices_for_path(path))
    except UsageError:
        devices = ()     # no block device: the application layer only
    return PathTarget(path, kdev, mnt.fstype, mnt.source, devices, seen if seen != kdev else 0)


@dataclass(frozen=True)
class QueueLimits:
    """The request limits of a block device's queue (sysfs), 0 when unknown."""

    max_sectors_kb: int = 0          # largest request the block layer builds, KiB
    max_hw_sectors_kb: int = 0
    max_segments: int = 0
    max_segment_size: int = 0        # bytes
    logical_block_size: int = 0


def queue_limits(name: str) -> QueueLimits:
    q = SYS_BLOCK / name / "queue"

    def read(key: str) -> int:
        try:
            return int((q / key).read_text().strip())
        except (OSError, ValueError):
            return 0

    return QueueLimits(read("max_sectors_kb"), read("max_hw_sectors_kb"), read("max_segments"),
                       read("max_segment_size"), read("logical_block_size"))


def set_max_sectors_kb(name: str, kib: int) -> int:
    """Set a device's max_sectors_kb; returns the previous value."""
    f = SYS_BLOCK / name / "queue" / "max_sectors_kb"
    try:
        old = int(f.read_text().strip())
        f.write_text(f"{kib}\n")
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot set max_sectors_kb of {name} to {kib}: {e}") from None
    return old


__all__ = ["PathTarget", "QueueLimits", "kernel_dev", "path_target", "queue_limits", "set_max_sectors_kb"]
