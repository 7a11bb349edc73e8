"""Resolve device names and paths to block devices, read sysfs."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..fs import mountinfo

SYS_DEV_BLOCK = Path("/sys/dev/block")
SYS_BLOCK = Path("/sys/block")


@dataclass(frozen=True)
class BlockDevice:
    major: int
    minor: int
    name: str          # kernel name: loop0, vda, nvme0n1

    @property
    def path(self) -> str:
        return f"/dev/{self.name}"

    @property
    def kdev(self) -> int:
        """dev_t as the block tracepoints encode it (major << 20 | minor)."""
        return (self.major << 20) | self.minor

    @property
    def number(self) -> str:
        return f"{self.major}:{self.minor}"


def kdev_split(kdev: int) -> tuple[int, int]:
    return kdev >> 20, kdev & 0xFFFFF


def device_by_number(major: int, minor: int) -> BlockDevice | None:
    """The block device major:minor, or None if the kernel has none."""
    uevent = SYS_DEV_BLOCK / f"{major}:{minor}" / "uevent"
    try:
        text = uevent.read_text()
    except OSError:
        return None
    m = re.search(r"^DEVNAME=(.+)$", text, re.M)
    return BlockDevice(major, minor, m.group(1) if m else f"{major}:{minor}")


def name_for_kdev(kdev: int) -> BlockDevice:
    major, minor = kdev_split(kdev)
    return device_by_number(major, minor) or BlockDevice(major, minor, f"{major}:{minor}")


def list_devices() -> list[BlockDevice]:
    out = []
    for entry in sorted(SYS_BLOCK.iterdir()) if SYS_BLOCK.exists() else []:
        try:
            major, minor = (entry / "dev").read_text().strip().split(":")
        except OSError:
            continue
        out.append(BlockDevice(int(major), int(minor), entry.name))
    return out


def resolve_device(spec: str) -> BlockDevice:
    """A device from a name (loop0), a path (/dev/loop0) or a number (7:0).

    Partitions resolve to their whole disk: the block tracepoints report
    requests against the disk.
    """
    m = re.fullmatch(r"(\d+):(\d+)", spec)
    if m:
        dev = device_by_number(int(m.group(1)), int(m.group(2)))
    else:
        path = spec if spec.startswith("/") else f"/dev/{spec}"
        dev = _device_of_node(path)
    if dev is None:
        known = ", ".join(d.name for d in list_devices()[:8]) or "none"
        raise UsageError(
            f"no block device '{spec}': give a name, /dev path or major:minor "
            f"(this machine has: {known}; see `lsblk`)"
        )
    return whole_disk(dev)


def _device_of_node(path: str) -> BlockDevice | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    return device_by_number(os.major(st.st_rdev), os.minor(st.st_rdev))


def whole_disk(dev: BlockDevice) -> BlockDevice:
    """The disk a partition belongs to (the device itself otherwise)."""
    sysdir = SYS_DEV_BLOCK / dev.number
    if (sysdir / "partition").exists():
        parent = sysdir.resolve().parent
        try:
            major, minor = (parent / "dev").read_text().strip().split(":")
            return BlockDevice(int(major), int(minor), parent.name)
        except OSError:
            return dev
    return dev


def loop_backing_file(dev: BlockDevice) -> str | None:
    try:
        return (SYS_BLOCK / dev.name / "loop" / "backing_file").read_text().strip() or None
    except OSError:
        return None


def lower_devices(dev: BlockDevice) -> list[BlockDevice]:
    """Devices that carry `dev`'s I/O again: a loop device's backing file's
    disk, or the members of an md/dm device (sysfs `slaves`)."""
    out: list[BlockDevice] = []
    backing = loop_backing_file(dev)
    if backing:
        try:
            st = os.stat(backing)
        except OSError:
            st = None
        if st is not None and os.major(st.st_dev) != 0:
            lower = device_by_number(os.major(st.st_dev), os.minor(st.st_dev))
            if lower:
                out.append(whole_disk(lower))
    slaves = SYS_BLOCK / dev.name / "slaves"
    if slaves.is_dir():
        for s in sorted(slaves.iterdir()):
            lower = _device_of_sysfs(s)
            if lower:
                out.append(whole_disk(lower))
    return out


def _device_of_sysfs(entry: Path) -> BlockDevice | None:
    try:
        major, minor = (entry / "dev").read_text().strip().split(":")
    except OSError:
        return None
    return BlockDevice(int(major), int(minor), entry.name)


def describe(dev: BlockDevice) -> str:
    """A short human description: 'loop over /img (on vda)', 'disk'."""
    backing = loop_backing_file(dev)
    if backing:
        lower = lower_devices(dev)
        on = f" on {lower[0].name}" if lower else ""
        return f"loop over {backing}{on}"
    slaves = SYS_BLOCK / dev.name / "slaves"
    if slaves.is_dir() and any(slaves.iterdir()):
        return "over " + ", ".join(s.name for s in sorted(slaves.iterdir()))
    return ""


def size_bytes(dev: BlockDevice) -> int:
    """The device's capacity in bytes from sysfs (0 when the kernel does not say)."""
    try:
        return int((SYS_DEV_BLOCK / dev.number / "size").read_text()) * 512
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str
    number: tuple[int, int]


def mount_of(path: str) -> Mount:
    """The mount holding `path` (longest mount point prefix in mountinfo)."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in mountinfo.read():
        mp = m.mount_point
        if real == mp or real.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mount_point):
                major, minor = m.number.split(":")
                best = Mount(mp, m.fstype, m.source, (int(major), int(minor)))
    if best is None:
        raise UsageError(f"cannot find the mount holding {path}")
    return best


def mount_point_of(dev: BlockDevice) -> str | None:
    """Where `dev` is mounted (its filesystem's device number, or for btrfs
    its mount source), the shortest mount point if several; None if nowhere."""
    found = [m.mount_point for m in mountinfo.read() if m.number == dev.number or m.source == dev.path]
    return min(found, key=len) if found else None


def stat_path(path: str) -> os.stat_result:
    """os.stat of a path the user gave; a UsageError naming the fix when it
    does not exist or cannot be read."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"path '{path}' does not exist: give an existing file or directory") from None
    except PermissionError:
        raise UsageError(f"cannot read '{path}': permission denied") from None


def devices_for_path(path: str) -> list[BlockDevice]:
    """The block device(s) a file or directory lives on.

    A plain filesystem gives its device (a partition gives its disk); btrfs
    gives every member device; a filesystem with no block device (tmpfs,
    overlay, NFS) is an error naming the problem.
    """
    st = stat_path(path)
    if stat.S_ISBLK(st.st_mode):
        dev = device_by_number(os.major(st.st_rdev), os.minor(st.st_rdev))
        if dev:
            return [whole_disk(dev)]
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major != 0:
        dev = device_by_number(major, minor)
        if dev:
            return [whole_disk(dev)]
    mnt = mount_of(path)
    if mnt.fstype == "btrfs":
        members = btrfs_members(mnt.source)
        if members:
            return members
    raise UsageError(
        f"'{path}' is on {mnt.fstype} ({mnt.source}), which has no block device to "
        f"trace: put it on a filesystem backed by a disk or loop device"
    )


def btrfs_members(source: str) -> list[BlockDevice]:
    """All member devices of the btrfs filesystem mounted from `source`."""
    src = _device_of_node(source)
    root = Path("/sys/fs/btrfs")
    if src is None or not root.is_dir():
        return []
    for fs in root.iterdir():
        devdir = fs / "devices"
        if devdir.is_dir() and any(e.name == src.name for e in devdir.iterdir()):
            members = [_device_of_sysfs(e.resolve()) for e in sorted(devdir.iterdir())]
            return [whole_disk(m) for m in members if m]
    return [whole_disk(src)]


def choose_devices(names: tuple[str, ...] = (), paths: tuple[str, ...] = (),
                   with_lower: bool = False) -> list[BlockDevice]:
    """The devices named (name, /dev path or MAJ:MIN) and those holding each
    path, plus what they sit on when `with_lower`; each once, in that order."""
    chosen = [resolve_device(d) for d in names]
    for p in paths:
        chosen += devices_for_path(p)
    if with_lower:
        chosen += [low for dev in list(chosen) for low in lower_devices(dev)]
    return list(dict.fromkeys(chosen))
