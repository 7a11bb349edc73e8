"""A drive's identity, independent of where it is mounted: what a sweep
journal is keyed by, so each drive resumes its own journal.

For a directory: the UUID of the filesystem holding it (blkid reads it from
the superblock, with or without udev's /dev/disk/by-uuid), plus a hardware
identity of each device under it where the kernel has one (WWID or serial in
sysfs). Without a filesystem UUID, each device's MAJ:MIN and size stand in.
A filesystem with no block device (tmpfs, overlay) is identified by its
mount source and type."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import UsageError
from .devices import SYS_BLOCK, BlockDevice, device_by_number, devices_for_path, mount_of, size_bytes, whole_disk

HARDWARE_ID_FILES = ("wwid", "device/wwid", "serial", "device/serial")


def drive_identity(path: str) -> dict[str, object]:
    """{"filesystem_uuid": ..., "devices": [...]} for the drive holding `path`."""
    try:
        devices = devices_for_path(path)
    except UsageError:
        mnt = mount_of(path)
        return {"filesystem": f"{mnt.fstype} {mnt.source}"}
    uuid = filesystem_uuid(path)
    hardware = [h for h in (hardware_id(d) for d in devices) if h]
    if uuid:
        return {"filesystem_uuid": uuid, **({"devices": hardware} if hardware else {})}
    return {"devices": [hardware_id(d) or f"{d.number} {size_bytes(d)} bytes" for d in devices]}


def device_identities(dev: BlockDevice) -> tuple[str, set[str]]:
    """(filesystem UUID on `dev` or "", the ids drive_identity may list for
    it): what a sweep journal's drive is matched against."""
    uuid = _blkid_uuid(dev.path)
    ids = {f"{dev.number} {size_bytes(dev)} bytes"}
    for d in {dev, whole_disk(dev)}:
        if hardware_id(d):
            ids.add(hardware_id(d))
    return uuid, ids


def journal_drive_matches(drive: dict[str, object], uuid: str, ids: set[str]) -> bool:
    """Whether a journal's drive identity (drive_identity's dict) is the device
    with this UUID and these ids."""
    if uuid and drive.get("filesystem_uuid") == uuid:
        return True
    listed = drive.get("devices")
    return isinstance(listed, list) and any(str(x) in ids for x in listed)


def _blkid_uuid(node: str) -> str:
    blkid = shutil.which("blkid")
    if blkid is None:
        return ""
    try:
        proc = subprocess.run([blkid, "-o", "value", "-s", "UUID", node], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip()


def filesystem_uuid(path: str) -> str:
    """The UUID of the filesystem holding `path` ("" when it has none or blkid is missing)."""
    st = os.stat(path)
    dev = device_by_number(os.major(st.st_dev), os.minor(st.st_dev)) if os.major(st.st_dev) else None
    # btrfs has an anonymous st_dev: its mount source is one of its members
    node = dev.path if dev is not None else mount_of(path).source
    return _blkid_uuid(node) if node.startswith("/dev/") else ""


def hardware_id(dev: BlockDevice) -> str:
    """The device's WWID or serial from sysfs ("" when the kernel has none, e.g. loop)."""
    for name in HARDWARE_ID_FILES:
        try:
            value = (SYS_BLOCK / dev.name / name).read_text().strip()
        except OSError:
            continue
        if value:
            return f"{Path(name).name}:{value}"
    return ""
