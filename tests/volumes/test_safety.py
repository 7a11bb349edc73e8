"""Safety rails on real loop devices: every refusal case leaves the device's
content unchanged; the root disk is always refused without the flag."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from iotune.blockdev.devices import devices_for_path
from iotune.errors import UsageError
from iotune.volumes.safety import DestroyRefused, inspect, require_safe

from tests.conftest import make_loops, needs_root


def digest(dev: str) -> str:
    with open(dev, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@pytest.fixture
def loop(tmp_path: Path):
    [dev] = make_loops(tmp_path, 1, 16 << 20)
    yield dev
    subprocess.run(["swapoff", dev], check=False, capture_output=True)
    subprocess.run(["umount", str(tmp_path / "mnt")], check=False, capture_output=True)
    subprocess.run(["partx", "-d", dev], check=False, capture_output=True)   # partition nodes outlive detach
    subprocess.run(["losetup", "-d", dev], check=False)


def refused(dev: str, reason: str) -> None:
    before = digest(dev)
    with pytest.raises(DestroyRefused) as e:
        require_safe([dev], [])
    msg = str(e.value)
    name = dev.split("/")[-1]
    assert f"{name} {reason}" in msg and msg.endswith(f"If you mean to destroy it, name it: --destroy-data {name}")
    assert digest(dev) == before


@needs_root
def test_blank_device_is_allowed(loop: str) -> None:
    assert inspect(require_safe([loop], [])[0]) == []


@needs_root
def test_ext4_signature_is_refused(loop: str) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True)
    refused(loop, "carries a ext4 signature")
    assert require_safe([loop], [loop])[0].path == loop     # named explicitly: allowed


@needs_root
def test_mounted_device_is_refused(loop: str, tmp_path: Path) -> None:
    # A read-write ext4 mount goes on writing by itself (lazy inode-table
    # init, superblock and journal updates), which would change the digest
    # whatever iotune does; mounted read-only, every byte that changes is ours.
    subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True)
    (tmp_path / "mnt").mkdir()
    subprocess.run(["mount", "-o", "ro,noload", loop, str(tmp_path / "mnt")], check=True)
    refused(loop, f"mounted at {tmp_path / 'mnt'}")


@needs_root
def test_partitioned_device_is_refused(loop: str) -> None:
    subprocess.run(["sfdisk", "-q", loop], input="label: gpt\n,8M\n", text=True, check=True, capture_output=True)
    subprocess.run(["partx", "-a", loop], check=False, capture_output=True)
    refused(loop, "has partitions")


@needs_root
def test_swap_device_is_refused(loop: str) -> None:
    subprocess.run(["mkswap", loop], check=True, capture_output=True)
    if subprocess.run(["swapon", loop], capture_output=True).returncode != 0:
        pytest.skip("needs swapon to work on a loop device here")
    refused(loop, "in use as swap")


@needs_root
def test_an_unprobeable_root_filesystem_fails_closed(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the device holding / cannot be found, any device might be it:
    refused, naming why, unless named with --destroy-data."""
    def no_device(path: str) -> list:
        raise UsageError(f"'{path}' is on overlay (overlay), which has no block device to trace")

    monkeypatch.setattr("iotune.volumes.safety.devices_for_path", no_device)
    refused(loop, "may hold the root or boot filesystem: cannot tell where it lives "
                  "(/: '/' is on overlay (overlay), which has no block device to trace)")
    assert require_safe([loop], [loop])[0].path == loop


@needs_root
def test_an_unprobeable_signature_fails_closed(loop: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))          # no wipefs
    refused(loop, "signature unknown (wipefs could not run)")


def _root_disk_missing() -> str | None:
    """Why / has no block device here (an overlay or tmpfs root, as in many containers), or None."""
    try:
        devices_for_path("/")
    except UsageError as e:
        return f"needs / on a block device: {e}"
    return None


@pytest.mark.skipif(_root_disk_missing() is not None, reason=_root_disk_missing() or "")
def test_root_disk_is_always_refused() -> None:
    [root] = devices_for_path("/")
    with pytest.raises(DestroyRefused, match=f"{root.name} holds the root or boot filesystem"):
        require_safe([root.name], [])
