"""The pieces test drives are built from, shared by scratch and emulated
drives and layouts: each adds itself to an ExitStack so it is undone on
exit, error or Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from ..blockdev.devices import BlockDevice, resolve_device
from ..host.undo import loop_identity, unmount
from ..host.ledger import note, temp_dir
from ..host.proc import run
from ..errors import PrivilegeError, UsageError

MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f", "-K"],
    "btrfs": ["mkfs.btrfs", "-q", "-f", "--nodiscard"],
}


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PrivilegeError(f"{what} need root (losetup, mount, cgroups): run with sudo")


def workdir(stack: contextlib.ExitStack, directory: Path | None, prefix: str) -> Path:
    """`directory`, which must exist, or a fresh temporary one removed on exit."""
    if directory is None:
        return temp_dir(stack, prefix)
    if not directory.is_dir():
        raise UsageError(f"--dir {directory} is not a directory: create it or choose another")
    return directory


def create_file(stack: contextlib.ExitStack, path: Path, size_bytes: int) -> None:
    """A new sparse file of `size_bytes`, removed on exit."""
    entry = note(stack, "file", path=path.resolve())   # before: a kill between open and note would leak it
    try:
        fh = path.open("xb")
    except FileExistsError:
        if entry is not None:
            entry.drop()              # someone else's (or an earlier run's with our pid): never ours to remove
        raise
    with fh:
        fh.truncate(size_bytes)
    stack.callback(path.unlink, True)


def attach_loop(stack: contextlib.ExitStack, image: Path, sector_size: int = 0) -> BlockDevice:
    """A loop device with direct I/O over `image` (optionally with a logical
    sector size), detached on exit."""
    sector = ["--sector-size", str(sector_size)] if sector_size else []
    note(stack, "loop", **loop_identity(image))          # before: the image is ours, so is any loop over it
    loop = run(["losetup", "--direct-io=on", *sector, "-f", "--show", str(image)]).strip()
    stack.callback(detach_loop, loop)
    reset_loop_queue(Path(loop).name)
    return resolve_device(loop)


# A loop device keeps its queue settings across detach and re-attach (seen on
# 6.18: max_sectors_kb lowered by an earlier user stayed at 128 on the next
# one), so a newly attached device is set back to the kernel's defaults.
LOOP_QUEUE_DEFAULTS = {"scheduler": "none"}


def reset_loop_queue(name: str, sysfs: Path = Path("/sys/block")) -> None:
    """max_sectors_kb back to the device's hardware limit, and the loop
    driver's default scheduler; settings the kernel refuses are left."""
    queue = sysfs / name / "queue"
    with contextlib.suppress(OSError):
        hw = (queue / "max_hw_sectors_kb").read_text().strip()
        if (queue / "max_sectors_kb").read_text().strip() != hw:
            (queue / "max_sectors_kb").write_text(hw)
    for key, value in LOOP_QUEUE_DEFAULTS.items():
        with contextlib.suppress(OSError):
            if f"[{value}]" not in (queue / key).read_text():
                (queue / key).write_text(value)


def detach_loop(loop: str, timeout_s: float = 5.0) -> None:
    """Detach `loop`. The kernel defers a detach while something still holds
    the device open (udev probing it, say), so wait until it is gone."""
    subprocess.run(["losetup", "-d", loop], capture_output=True, check=False)
    backing = Path("/sys/block") / Path(loop).name / "loop" / "backing_file"
    deadline = time.monotonic() + timeout_s
    while backing.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def format_and_mount(stack: contextlib.ExitStack, device: BlockDevice, directory: Path, fstype: str) -> Path:
    """`fstype` made on `device` and mounted (noatime) in `directory`;
    unmounted on exit."""
    if fstype not in MKFS:
        raise UsageError(f"unknown filesystem '{fstype}': choose one of {', '.join(MKFS)}")
    run([*MKFS[fstype], device.path])
    mnt = directory / f"iotune-mnt-{device.name}"
    mnt.mkdir(exist_ok=True)
    note(stack, "mount", target=mnt.resolve(), rmdir=1)   # before: the directory is ours
    stack.callback(unmount, mnt.resolve(), remove_dir=True)
    run(["mount", "-o", "noatime", device.path, str(mnt)])
    return mnt

