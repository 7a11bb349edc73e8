"""Resolving devices and paths on real loop devices and filesystems."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.blockdev.devices import devices_for_path, lower_devices, resolve_device, whole_disk
from iotune.cli import cli
from iotune.errors import UsageError

from tests.conftest import make_loops, needs_root, needs_tracing


def test_root_filesystem_resolves_to_a_disk() -> None:
    [dev] = devices_for_path("/")
    assert Path(f"/sys/block/{dev.name}").exists()    # a whole disk, not a partition


@needs_root
def test_device_names_paths_and_numbers_agree(loop_drive) -> None:
    assert resolve_device(loop_drive.name) == loop_drive
    assert resolve_device(loop_drive.path) == loop_drive
    assert resolve_device(loop_drive.number) == loop_drive
    assert loop_drive.kdev == (7 << 20) | loop_drive.minor
    [backing] = lower_devices(loop_drive)
    assert backing == devices_for_path("/tmp")[0]


@needs_root
def test_partition_resolves_to_its_disk(tmp_path: Path) -> None:
    [loop] = make_loops(tmp_path, 1, 64 << 20)
    try:
        subprocess.run(["sfdisk", "-q", loop], input="label: gpt\n,32M\n", text=True, check=True,
                       capture_output=True)
        subprocess.run(["partx", "-a", loop], check=False, capture_output=True)
        part = resolve_device(f"{loop}p1")
        assert part == resolve_device(loop) == whole_disk(part)
    finally:
        # the kernel keeps partition nodes across detach: a later loop device with this
        # number would show them (and be refused as partitioned)
        subprocess.run(["partx", "-d", loop], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", loop], check=False)


@needs_root
def test_ext4_on_loop_path(tmp_path: Path) -> None:
    [loop] = make_loops(tmp_path, 1, 64 << 20)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
        subprocess.run(["mount", loop, str(mnt)], check=True)
        (mnt / "swap").mkdir()
        assert devices_for_path(str(mnt / "swap")) == [resolve_device(loop)]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", loop], check=False)


@needs_tracing
def test_btrfs_raid0_path_traces_every_member(tmp_path: Path) -> None:
    loops = make_loops(tmp_path, 2)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.btrfs", "-q", "-f", "--nodiscard", "-d", "raid0", "-m", "raid1", *loops],
                       check=True, capture_output=True)
        subprocess.run(["mount", loops[0], str(mnt)], check=True)
        members = devices_for_path(str(mnt))
        assert sorted(d.name for d in members) == sorted(os.path.basename(x) for x in loops)
        r = CliRunner().invoke(cli, ["trace", "--no-save", "--json", "--path", str(mnt), "--", "dd",
                                     "if=/dev/zero", f"of={mnt}/f", "bs=512K", "count=23", "oflag=direct"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert sorted(doc["run"]["device_filter"]) == sorted(d.name for d in members)
        per_dev = {d["name"]: d["directions"].get("write", {}).get("bytes", 0) for d in doc["run"]["devices"]}
        assert all(per_dev.get(d.name, 0) > 0 for d in members)    # raid0 spreads the data
        assert doc["totals"]["write_bytes"] >= 23 * 512 * 1024
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        for x in loops:
            subprocess.run(["losetup", "-d", x], check=False)


def test_nonexistent_number() -> None:
    with pytest.raises(UsageError, match=r"no block device '4095:4095'"):
        resolve_device("4095:4095")
