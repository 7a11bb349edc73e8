"""Scratch drives: loop devices over files, with direct I/O and an optional
cgroup v1 blkio bandwidth cap, so a run has a known physical limit on any
machine. A scratch drive lives in a directory the user gives (or a fresh
temporary one) and never touches an existing device, so it needs no
destroy flag. Everything is undone on exit, error or Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..blockdev.devices import BlockDevice, resolve_device
from ..errors import IotuneError, PrivilegeError, UsageError

BLKIO = Path("/sys/fs/cgroup/blkio")


@dataclass(frozen=True)
class ScratchDrive:
    device: BlockDevice
    image: Path
    cgroup: Path | None        # processes in it are capped to the drive's bandwidth
    mount_point: Path | None   # set when a filesystem was made


def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise IotuneError(f"{argv[0]} is not installed: run scripts/setup.sh or `iotune doctor --fix`") from None
    if out.returncode != 0:
        raise IotuneError(f"`{' '.join(argv)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


@contextlib.contextmanager
def scratch_drive(directory: Path | None = None, size_bytes: int = 1 << 30, cap_bytes_per_s: int = 0,
                  fstype: str | None = None) -> Iterator[ScratchDrive]:
    """A capped loop drive over a file; with `fstype`, also formatted and mounted."""
    _require_root("scratch drives")
    with contextlib.ExitStack() as stack:
        workdir = _workdir(stack, directory, "iotune-scratch-")
        image = workdir / f"iotune-drive-{os.getpid()}.img"
        _create_file(stack, image, size_bytes)
        device = _attach_loop(stack, image)
        cgroup = _cap(stack, device, cap_bytes_per_s) if cap_bytes_per_s else None
        mount_point = _format_and_mount(stack, device, workdir, fstype) if fstype else None
        yield ScratchDrive(device, image, cgroup, mount_point)


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PrivilegeError(f"{what} need root (losetup, mount, cgroups): run with sudo")


def _workdir(stack: contextlib.ExitStack, directory: Path | None, prefix: str) -> Path:
    """`directory`, which must exist, or a fresh temporary one removed on exit."""
    if directory is None:
        workdir = Path(tempfile.mkdtemp(prefix=prefix))
        stack.callback(shutil.rmtree, workdir, True)
        return workdir
    if not directory.is_dir():
        raise UsageError(f"--dir {directory} is not a directory: create it or choose another")
    return directory


def _create_file(stack: contextlib.ExitStack, path: Path, size_bytes: int) -> None:
    """A new sparse file of `size_bytes`, removed on exit."""
    with path.open("xb") as fh:
        fh.truncate(size_bytes)
    stack.callback(path.unlink, True)


def _attach_loop(stack: contextlib.ExitStack, image: Path, sector_size: int = 0) -> BlockDevice:
    """A loop device with direct I/O over `image` (optionally with a logical
    sector size), detached on exit."""
    sector = ["--sector-size", str(sector_size)] if sector_size else []
    loop = _run(["losetup", "--direct-io=on", *sector, "-f", "--show", str(image)]).strip()
    stack.callback(_detach_loop, loop)
    return resolve_device(loop)


def _detach_loop(loop: str, timeout_s: float = 5.0) -> None:
    """Detach `loop`. The kernel defers a detach while something still holds
    the device open (udev probing it, say), so wait until it is gone."""
    subprocess.run(["losetup", "-d", loop], capture_output=True, check=False)
    backing = Path("/sys/block") / Path(loop).name / "loop" / "backing_file"
    deadline = time.monotonic() + timeout_s
    while backing.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _cap(stack: contextlib.ExitStack, device: BlockDevice, bytes_per_s: int, iops: int = 0) -> Path:
    """A fresh blkio cgroup throttling reads and writes on `device` to
    `bytes_per_s` and `iops` (0: no cap of that kind); removed on exit."""
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        raise IotuneError("cgroup v1 blkio throttling is not available: use --cap 0 for an uncapped drive")
    cg = BLKIO / f"iotune-{os.getpid()}-{device.name}"
    cg.mkdir()
    stack.callback(_remove_cgroup, cg)
    caps = {"bps_device": bytes_per_s, "iops_device": iops}
    for kind, limit in caps.items():
        for direction in ("read", "write") if limit else ():
            (cg / f"blkio.throttle.{direction}_{kind}").write_text(f"{device.number} {limit}\n")
    return cg


def _remove_cgroup(cg: Path) -> None:
    """Move stragglers to the root cgroup, then remove it."""
    try:
        for pid in (cg / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (BLKIO / "cgroup.procs").write_text(pid)
        cg.rmdir()
    except OSError:
        pass


MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f", "-K"],
    "btrfs": ["mkfs.btrfs", "-q", "-f", "--nodiscard"],
}


def _format_and_mount(stack: contextlib.ExitStack, device: BlockDevice, workdir: Path, fstype: str) -> Path:
    if fstype not in MKFS:
        raise UsageError(f"unknown filesystem '{fstype}': choose one of {', '.join(MKFS)}")
    _run([*MKFS[fstype], device.path])
    mnt = workdir / f"iotune-mnt-{device.name}"
    mnt.mkdir(exist_ok=True)
    stack.callback(_unmount, mnt)
    _run(["mount", "-o", "noatime", device.path, str(mnt)])
    return mnt


def _unmount(mnt: Path, attempts: int = 20) -> None:
    """Unmount and remove the mount point, waiting out processes that are
    still closing files there (killed children finishing in-flight I/O);
    a last resort detaches it lazily so nothing stays mounted."""
    for _ in range(attempts):
        if not os.path.ismount(mnt):
            break
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
            break
        time.sleep(0.25)
    else:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    with contextlib.suppress(OSError):
        mnt.rmdir()
