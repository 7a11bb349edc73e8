"""Layouts on real loop devices: btrfs raid0 (md is missing here, so the md
plan is checked with md_available monkeypatched both ways), mount options and
geometry read back, queue tunables restored, drive-count scaling against a
known cap, safety and teardown."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from iotune.blockdev.devices import resolve_device
from iotune.errors import UsageError
from iotune.model.layout import BuildPlan
from iotune.model.sweep import SweepPoint
from iotune.render.volumes import volume_json
from iotune.sweep.executor import Target
from iotune.sweep.fio_executor import FioExecutor
from iotune.volumes import layout
from iotune.volumes.layout import LayoutSpec, _mkfs, build_layout, md_available, plan_layout
from iotune.volumes.safety import DestroyRefused

from tests.conftest import make_loops, needs_fio, needs_root
from tests.project.test_schemas import conforms, strict_json

CAP = 100_000_000


def test_md_is_available_only_with_mdstat_and_mdadm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mdstat = tmp_path / "mdstat"
    monkeypatch.setattr(layout, "MDSTAT", mdstat)
    monkeypatch.setattr(layout.shutil, "which", lambda name: f"/sbin/{name}")
    assert md_available() == (False, f"this kernel has no md RAID ({mdstat} is missing)")
    mdstat.write_text("Personalities : [raid0]\n")
    assert md_available() == (True, "md RAID available")
    monkeypatch.setattr(layout.shutil, "which", lambda name: None)
    assert md_available() == (False, "mdadm is not installed (apt-get install mdadm)")


MD_MISSING = "this kernel has no md RAID (/proc/mdstat is missing)"


@pytest.mark.parametrize("md", [True, False], ids=["md", "no-md"])
def test_raid0_is_md_where_available_else_btrfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, md: bool) -> None:
    why = "md RAID available" if md else MD_MISSING
    monkeypatch.setattr(layout, "md_available", lambda: (md, why))
    spec = LayoutSpec(devices=("/dev/a", "/dev/b"), raid0=True, fstype="xfs")
    plan = plan_layout(spec, tmp_path)
    if md:
        assert plan == BuildPlan("md", why, "xfs", (
            ("mdadm", "--create", "/dev/md/iotune", "--run", "--level=0", "--raid-devices=2",
             f"--chunk={spec.chunk_bytes // 1024}K", "/dev/a", "/dev/b"),
            _mkfs("xfs", ["/dev/md/iotune"], False, spec.chunk_bytes, 2),
            ("mount", "-o", "noatime", "/dev/md/iotune", str(tmp_path))), "/dev/md/iotune", spec.chunk_bytes)
        assert plan_layout(replace(spec, backend="md"), tmp_path) == plan
        return
    assert plan.backend == "btrfs" and plan.fstype == "btrfs" and plan.stripe_bytes == 64 << 10
    assert plan.reason == MD_MISSING + "; using btrfs raid0 (data stripe fixed at 64 KiB, filesystem btrfs)"
    with pytest.raises(UsageError, match="md RAID requested but this kernel has no md RAID"):
        plan_layout(LayoutSpec(devices=("/dev/a", "/dev/b"), raid0=True, backend="md"), tmp_path)


def test_stripe_alignment_follows_the_raid_geometry() -> None:
    assert _mkfs("xfs", ["/dev/md0"], False, 512 << 10, 3) == ("mkfs.xfs", "-q", "-f", "-K", "-d", "su=512k,sw=3",
                                                              "/dev/md0")
    assert _mkfs("ext4", ["/dev/md0"], False, 512 << 10, 3) == ("mkfs.ext4", "-q", "-F", "-E",
                                                               "nodiscard,stride=128,stripe_width=384", "/dev/md0")


def mounts_of(mnt: Path) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if line.split()[1] == str(mnt)]


@pytest.fixture
def loops(tmp_path: Path):
    devs = make_loops(tmp_path, 3, 512 << 20)
    yield devs
    for d in devs:
        subprocess.run(["losetup", "-d", d], check=False)


@needs_root
def test_btrfs_raid0_with_mount_options(loops: list[str], tmp_path: Path) -> None:
    mnt = tmp_path / "vol"
    spec = LayoutSpec(devices=tuple(loops[:2]), raid0=True, mount_options=("noatime", "nodatacow"))
    with build_layout(spec, mnt, scratch=True) as vol:
        [line] = mounts_of(mnt)
        assert line.split()[2] == "btrfs" and "noatime" in line and "nodatacow" in line
        show = subprocess.run(["btrfs", "filesystem", "show", str(mnt)], capture_output=True, text=True).stdout
        assert all(d in show for d in loops[:2]) and "Total devices 2" in show
        assert vol.plan.backend == "btrfs"
        doc = strict_json(volume_json(str(vol.path), vol.plan))       # what `iotune volumes build --json` prints
        conforms("volumes-build-1", doc)
        assert (doc["mount"], doc["source"], doc["stripe_bytes"]) == (str(mnt), loops[0], 64 << 10)
    assert mounts_of(mnt) == []


@needs_root
@pytest.mark.parametrize("fstype,options,expect", [
    ("xfs", ("noatime", "logbsize=256k"), "logbsize=256k"),
    ("ext4", ("noatime", "data=writeback"), "data=writeback"),
])
def test_filesystem_options_are_applied(loops: list[str], tmp_path: Path, fstype: str, options: tuple,
                                        expect: str) -> None:
    mnt = tmp_path / "vol"
    with build_layout(LayoutSpec(devices=(loops[0],), fstype=fstype, mount_options=options), mnt, scratch=True):
        [line] = mounts_of(mnt)
        assert line.split()[2] == fstype and expect in line
    assert mounts_of(mnt) == []


@needs_root
def test_queue_tunables_are_restored_even_after_an_error(loops: list[str], tmp_path: Path) -> None:
    knob = Path(f"/sys/block/{Path(loops[0]).name}/queue/read_ahead_kb")
    before = knob.read_text().strip()
    spec = LayoutSpec(devices=(loops[0],), fstype="ext4", queue={"read_ahead_kb": "4096"})
    with pytest.raises(RuntimeError), build_layout(spec, tmp_path / "vol", scratch=True):
        assert knob.read_text().strip() == "4096"
        raise RuntimeError("trial failed")
    assert knob.read_text().strip() == before and mounts_of(tmp_path / "vol") == []


@needs_root
def test_a_device_with_data_is_refused_untouched(loops: list[str], tmp_path: Path) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", loops[0]], check=True)
    digest = hashlib.sha256(Path(loops[0]).read_bytes()).hexdigest()
    with pytest.raises(DestroyRefused, match="carries a ext4 signature"), \
            build_layout(LayoutSpec(devices=(loops[0],)), tmp_path / "vol"):
        pass
    assert hashlib.sha256(Path(loops[0]).read_bytes()).hexdigest() == digest


@contextlib.contextmanager
def capped(devs: list[str], bytes_per_s: int):
    cg = Path("/sys/fs/cgroup/blkio") / f"iotune-test-{os.getpid()}"
    cg.mkdir()
    try:
        for d in devs:
            num = resolve_device(d).number
            for knob in ("read_bps_device", "write_bps_device"):
                (cg / f"blkio.throttle.{knob}").write_text(f"{num} {bytes_per_s}\n")
        yield str(cg)
    finally:
        cg.rmdir()


@needs_fio
@needs_root
def test_raid0_read_bandwidth_scales_with_drives(loops: list[str], tmp_path: Path) -> None:
    """btrfs raid0 over 1, 2, 3 drives capped at 100 MB/s each reads at 1x, 2x, 3x the cap (within 5%)."""
    ratios = []
    for n in (1, 2, 3):
        mnt = tmp_path / f"vol{n}"
        with capped(loops[:n], CAP) as cg, build_layout(LayoutSpec(devices=tuple(loops[:n]), raid0=n > 1,
                                                                    fstype="btrfs"), mnt, scratch=True):
            target = Target(mnt, 32 << 20, 3, cg, runtime_s=2.0, ramp_s=0.5)
            m, _ = FioExecutor().run(SweepPoint(block_size=1 << 20, queue_depth=16), target)
        ratios.append(m.read_bytes_per_s / CAP)
    for n, ratio in zip((1, 2, 3), ratios):
        assert abs(ratio - n) <= 0.05 * n, ratios


@needs_root
def test_cli_dry_run_touches_nothing(loops: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from iotune.cli import cli

    monkeypatch.setattr(layout, "md_available", lambda: (False, MD_MISSING))    # the btrfs fallback's commands
    args = ["volumes", "build", loops[0], loops[1], "--raid0", "--mount-options", "noatime,nodatacow",
            "--mount-point", "/mnt/iotune-test", "--dry-run"]
    commands = [f"mkfs.btrfs -q -f --nodiscard -d raid0 -m raid1 {loops[0]} {loops[1]}",
                f"mount -o noatime,nodatacow {loops[0]} /mnt/iotune-test"]
    r = CliRunner().invoke(cli, args)                                   # blank devices: the build would go ahead
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1:] == commands and r.stderr == ""
    subprocess.run(["mkfs.ext4", "-q", "-F", loops[0]], check=True)      # data: a real build would be refused
    digest = hashlib.sha256(Path(loops[0]).read_bytes()).hexdigest()
    r = CliRunner().invoke(cli, args)
    name = Path(loops[0]).name
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines()[1:] == [
        "# REFUSED: the real build would stop before running anything below:",
        f"#   {name} carries a ext4 signature",
        f"# to destroy that data anyway, add: --destroy-data {name}", *commands]
    assert r.stderr == (f"Error: refusing to overwrite devices that hold data or a system role: {name} carries "
                        f"a ext4 signature. If you mean to destroy it, name it: --destroy-data {name}\n")
    r = CliRunner().invoke(cli, [*args, "--json"])
    doc = strict_json(r.stdout)
    conforms("volumes-build-dry-run-1", doc)
    assert r.exit_code == 1 and doc["refused"] == [{"device": name, "what": "carries a ext4 signature"}]
    assert [" ".join(c) for c in doc["commands"]] == commands and doc["backend"] == "btrfs"
    r = CliRunner().invoke(cli, [*args, "--destroy-data", loops[0]])   # named: the build would go ahead
    assert r.exit_code == 0 and r.stdout.splitlines()[1:] == commands
    r = CliRunner().invoke(cli, [*args, "--destroy-data", loops[0], "--json"])
    assert r.exit_code == 0 and strict_json(r.stdout)["refused"] == []
    assert hashlib.sha256(Path(loops[0]).read_bytes()).hexdigest() == digest
    assert not Path("/mnt/iotune-test").exists()


def test_cli_refuses_the_root_disk() -> None:
    from click.testing import CliRunner

    from iotune.blockdev.devices import devices_for_path
    from iotune.cli import cli

    [root] = devices_for_path("/")
    r = CliRunner().invoke(cli, ["volumes", "build", root.name, "--mount-point", "/mnt/iotune-test"])
    assert r.exit_code == 1
    assert r.stderr.startswith(f"Error: refusing to overwrite devices that hold data or a system role: {root.name} "
                               f"holds the root or boot filesystem")
    assert r.stderr.rstrip().endswith(f"If you mean to destroy it, name it: --destroy-data {root.name}")
