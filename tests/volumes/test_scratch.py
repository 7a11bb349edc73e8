"""`iotune volumes scratch`, as the README promises it: capped loop drives
with direct I/O that stay until Ctrl-C (or SIGTERM), then are all removed."""

from __future__ import annotations

import json
import mmap
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from iotune.host.cgroup import join_cgroup_preexec
from iotune.blockdev.devices import resolve_device

from tests.conftest import needs_root
from tests.project.test_schemas import conforms

CAP = 150_000_000
MiB = 1 << 20


def _default_sigint() -> None:
    """The child gets SIGINT's default disposition (Python's Ctrl-C), even
    when the suite runs as a background job that inherited it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _write_direct(device: str, nbytes: int, cgroup: str) -> float:
    """Seconds a child in `cgroup` takes to write `nbytes` to `device` with O_DIRECT."""
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={device}", "bs=1M", f"count={nbytes // MiB}", "oflag=direct",
                    "status=none"], check=True, preexec_fn=join_cgroup_preexec(cgroup))
    return time.perf_counter() - start


def _drives(stdout: IO[str], as_json: bool) -> list[tuple[str, Path, str]]:
    """(device, image, cgroup) of the 2 drives, from the text lines or the --json line."""
    if as_json:
        doc = json.loads(stdout.readline())
        conforms("volumes-scratch-1", doc)
        assert doc["cap_bytes_per_s"] == CAP
        return [(d["device"], Path(d["image"]), d["cgroup"]) for d in doc["drives"]]
    lines = [stdout.readline().rstrip("\n").split("\t") for _ in range(2)]
    assert all(len(line) == 3 and line[2].startswith("cgroup ") for line in lines), lines
    return [(device, Path(image), line_cg.removeprefix("cgroup ")) for device, image, line_cg in lines]


@needs_root
@pytest.mark.parametrize("sig,as_json", [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_scratch_drives_are_capped_and_removed(tmp_path: Path, sig: signal.Signals, as_json: bool) -> None:
    argv = [sys.executable, "-m", "iotune", "volumes", "scratch", "--drives", "2", "--size", "64M",
            "--cap", "150MB/s", "--dir", str(tmp_path), *(["--json"] if as_json else [])]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_default_sigint)
    try:
        assert child.stdout is not None
        drives = _drives(child.stdout, as_json)
        assert len({d for d, _, _ in drives}) == len({i for _, i, _ in drives}) == 2
        for device, image, cgroup in drives:
            dev = resolve_device(device)
            assert stat.S_ISBLK(os.stat(device).st_mode)
            assert image.parent == tmp_path and image.stat().st_size == 64 * MiB
            loop = Path("/sys/block", dev.name, "loop")
            assert (loop / "dio").read_text().strip() == "1"
            assert (loop / "backing_file").read_text().strip() == str(image)
            for knob in ("read_bps_device", "write_bps_device"):
                assert Path(cgroup, f"blkio.throttle.{knob}").read_text().split() == [dev.number, str(CAP)]
        # the cap governs direct I/O from a process in the cgroup: 48 MB at 150 MB/s
        # takes at least 0.32 s (less the throttle's first burst)
        device, _, cgroup = drives[0]
        assert _write_direct(device, 48 * MiB, cgroup) >= 0.8 * 48 * MiB / CAP
        _check_direct_read(device)
    finally:
        child.send_signal(sig)
        _, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr
    assert "tearing down" in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []
    assert str(tmp_path) not in subprocess.run(["losetup", "-l"], capture_output=True, text=True).stdout
    assert [cg for _, _, cg in drives if Path(cg).exists()] == []


def _check_direct_read(device: str) -> None:
    """The device takes aligned O_DIRECT reads (and they return what dd wrote)."""
    buf = mmap.mmap(-1, MiB)
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], 0) == MiB
    finally:
        os.close(fd)
    assert buf[:] == bytes(MiB)


@needs_root
def test_blkio_cgroup_sets_caps_and_moves_stragglers_out(loop_drive) -> None:
    """The one way iotune makes a throttled cgroup: the caps as given, and on
    exit a process still inside is moved to the root cgroup, not left
    holding the cgroup (which could then never be removed)."""
    from iotune.host.cgroup import BLKIO, Throttle, blkio_cgroup

    sleeper = None
    try:
        with blkio_cgroup("test", [Throttle(loop_drive.number, 1_000_000, 2_000_000, 30, 40)]) as cg:
            assert cg.parent == BLKIO and cg.name == f"iotune-{os.getpid()}-test"
            knobs = {k: (cg / f"blkio.throttle.{k}").read_text().split()
                     for k in ("read_bps_device", "write_bps_device", "read_iops_device", "write_iops_device")}
            assert knobs == {"read_bps_device": [loop_drive.number, "1000000"],
                             "write_bps_device": [loop_drive.number, "2000000"],
                             "read_iops_device": [loop_drive.number, "30"],
                             "write_iops_device": [loop_drive.number, "40"]}
            sleeper = subprocess.Popen(["sleep", "30"], preexec_fn=join_cgroup_preexec(cg))
            assert (cg / "cgroup.procs").read_text().split() == [str(sleeper.pid)]
        assert not cg.exists() and sleeper.poll() is None
        assert str(sleeper.pid) in (BLKIO / "cgroup.procs").read_text().split()
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()


@needs_root
def test_blkio_cgroup_names_a_bad_device() -> None:
    from iotune.host.cgroup import BLKIO, Throttle, blkio_cgroup
    from iotune.errors import IotuneError

    with pytest.raises(IotuneError, match=r"cannot set blkio.throttle.read_bps_device to 5 for device 999:999: "):
        with blkio_cgroup("bad", [Throttle("999:999", read_bps=5)]):
            pass
    assert not (BLKIO / f"iotune-{os.getpid()}-bad").exists()


def test_a_reattached_loop_device_gets_the_kernel_defaults_back(tmp_path: Path) -> None:
    """The kernel keeps a loop device's queue settings across detach (an
    earlier user's max_sectors_kb=128 split every 512 KiB request into four
    on the next one): attach_loop sets them back."""
    from iotune.volumes.parts import reset_loop_queue

    q = tmp_path / "loop4" / "queue"
    q.mkdir(parents=True)
    (q / "max_hw_sectors_kb").write_text("1280\n")
    (q / "max_sectors_kb").write_text("128\n")
    (q / "scheduler").write_text("none [mq-deadline] kyber bfq\n")
    reset_loop_queue("loop4", tmp_path)
    assert (q / "max_sectors_kb").read_text() == "1280" and (q / "scheduler").read_text() == "none"
    reset_loop_queue("missing", tmp_path)          # no such device: nothing to do, no error
