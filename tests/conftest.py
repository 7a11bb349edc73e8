"""Shared fixtures. Tests that need root, BPF or loop devices skip with a
reason naming what is missing; CI has all of them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from iotune.blockdev.devices import BlockDevice, resolve_device
from iotune.blockdev.proc import prefer_interpreter_tools
from iotune.volumes.parts import reset_loop_queue

# Every process the tests start (DeepSpeed launchers and ranks included) builds
# DeepSpeed ops with this venv's ninja, as the setup did: see prefer_interpreter_tools.
prefer_interpreter_tools()


def missing_for_tracing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (BPF, loop devices)"
    if importlib.util.find_spec("bcc") is None:
        return "needs the bcc Python bindings (scripts/setup.sh)"
    if not Path("/dev/loop-control").exists() or shutil.which("losetup") is None:
        return "needs loop devices (/dev/loop-control, losetup)"
    return None


_MISSING = missing_for_tracing()
needs_root = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")   # root + BPF (bcc) + loop devices
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio: scripts/setup.sh")
_NO_TRAIN = next((f"needs {m} (pip install -e '.[train]')" for m in ("torch", "deepspeed")
                  if importlib.util.find_spec(m) is None), None)
needs_deepspeed = pytest.mark.skipif(_NO_TRAIN is not None, reason=_NO_TRAIN or "")


def needs_root_for(what: str) -> pytest.MarkDecorator:
    """Root only (no BPF): the reason names what the test does as root."""
    return pytest.mark.skipif(os.geteuid() != 0, reason=f"needs root ({what})")


@pytest.fixture
def loop_drive(tmp_path: Path) -> Iterator[BlockDevice]:
    """A 64 MiB loop device with direct I/O over a file in tmp_path."""
    image = tmp_path / "drive.img"
    with image.open("wb") as fh:
        fh.truncate(64 << 20)
    path = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)],
                          capture_output=True, text=True, check=True).stdout.strip()
    reset_loop_queue(Path(path).name)        # a loop device keeps an earlier user's queue settings
    try:
        yield resolve_device(path)
    finally:
        subprocess.run(["losetup", "-d", path], check=False)


def make_loops(tmp_path: Path, n: int, size: int = 256 << 20) -> list[str]:
    """n loop devices with direct I/O over fresh files. Partition nodes a
    previous user of the same loop number left behind (the kernel keeps them
    across detach) are dropped, so each device starts blank."""
    out = []
    for i in range(n):
        image = tmp_path / f"member{i}.img"
        with image.open("wb") as fh:
            fh.truncate(size)
        dev = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)],
                             capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["partx", "-d", dev], check=False, capture_output=True)
        reset_loop_queue(Path(dev).name)
        out.append(dev)
    return out


@contextlib.contextmanager
def ext4_mount(tmp_path: Path, size: int) -> Iterator[Path]:
    """A fresh ext4 filesystem of `size` bytes on a direct-I/O loop device,
    mounted at tmp_path/mnt; unmounted and detached afterwards."""
    [loop] = make_loops(tmp_path, 1, size)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
        subprocess.run(["mount", loop, str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", loop], check=False)
