"""Sweeping a second drive just works: the default journal directory is
keyed by the drive's identity (its filesystem UUID and devices), not by the
path, so each drive resumes its own journal, and the same drive mounted
elsewhere resumes the same one. Two loop-device filesystems, fio trials."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.blockdev.identity import drive_identity
from iotune.cli import cli
from iotune.sweep.aio.command import SweepArgs
from iotune.sweep.target import BUILTIN_LIMITS, default_out, drive_of
from iotune.sweep.journal import Journal

from tests.conftest import make_loops, needs_fio, needs_root_for
from tests.sweep.test_sweep_cli import PROFILE

needs_loops = needs_root_for("loop devices and mount")


def test_the_built_in_drive_is_keyed_by_its_limits() -> None:
    drive = drive_of(SweepArgs(target_dir=None))
    assert drive == {"emulated": BUILTIN_LIMITS.to_json()}
    out = default_out("default", drive, "fio")
    assert out.parent == Path("iotune-sweeps") and out.name.startswith("default-fio-") and len(out.name) == 20
    assert default_out("default", dict(drive), "fio") == out
    assert default_out("default", {"emulated": {**BUILTIN_LIMITS.to_json(), "iops": 1}}, "fio") != out


@pytest.fixture
def two_drives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(PROFILE)
    loops = make_loops(tmp_path, 2, 64 << 20)
    mounts = []
    try:
        for i, loop in enumerate(loops):
            subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
            mnt = tmp_path / f"mnt{i}"
            mnt.mkdir()
            subprocess.run(["mount", loop, str(mnt)], check=True)
            mounts.append(mnt)
        yield tmp_path, loops, mounts
    finally:
        for mnt in (tmp_path / "mnt0", tmp_path / "mnt1", tmp_path / "elsewhere"):
            subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        for loop in loops:
            subprocess.run(["losetup", "-d", loop], check=False)


def sweep(work: Path, path: Path) -> dict:
    r = CliRunner().invoke(cli, ["sweep", "--path", str(path), "--profile", str(work / "p.toml"), "--json"])
    assert r.exit_code == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@needs_loops
@needs_fio
def test_each_drive_resumes_its_own_journal_wherever_it_is_mounted(two_drives) -> None:
    work, loops, (a, b) = two_drives
    ida, idb = drive_identity(str(a)), drive_identity(str(b))
    assert ida != idb and set(ida) == {"filesystem_uuid"}           # loop devices have no WWID or serial
    first_a = sweep(work, a)
    first_b = sweep(work, b)                                         # a second drive: not refused
    ja, jb = Path(first_a["journal"]), Path(first_b["journal"])
    assert ja.parent != jb.parent and ja.parent.parent == jb.parent.parent == Path("iotune-sweeps")
    assert first_a["trials_run_now"] == first_a["trials"] > 0          # both new journals
    assert first_b["trials_run_now"] == first_b["trials"] > 0
    assert Journal(ja).env.drive == ida and Journal(jb).env.drive == idb
    again_a = sweep(work, a)                                         # each resumes its own
    assert again_a["journal"] == str(ja) and again_a["trials_run_now"] == 0
    subprocess.run(["umount", str(a)], check=True)
    (work / "elsewhere").mkdir()
    subprocess.run(["mount", loops[0], str(work / "elsewhere")], check=True)
    moved = sweep(work, work / "elsewhere")                          # the same drive at another path
    assert moved["journal"] == str(ja) and moved["trials_run_now"] == 0
    assert Journal(ja).env.target == str(a)                          # the header keeps where it first ran
