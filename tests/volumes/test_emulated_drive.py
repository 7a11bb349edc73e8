"""The emulated drive: the model's arithmetic by hand, and the real drive
against fio (direct I/O, libaio) at known limits."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from iotune.blockdev.devices import BlockDevice
from iotune.errors import IotuneError, PrivilegeError, UsageError
from iotune.model.drive import DriveLimits
from iotune.volumes.emulated import (
    EmulatedDrive,
    build_daemon,
    emulated_drive,
    measure_overhead_us,
)

from tests.conftest import needs_fio, needs_root

KiB, MiB, MB = 1 << 10, 1 << 20, 1_000_000


# ---- the model, by hand ---------------------------------------------------

def test_ceiling_without_limits_is_infinite() -> None:
    assert DriveLimits().ceiling_bytes_per_s(4096, 8) == float("inf")


def test_ceiling_follows_littles_law_below_saturation() -> None:
    # 1 ms per request + 0.25 ms overhead, 4 in flight: 4 / 1.25 ms = 3200 IOPS
    limits = DriveLimits(latency_us=1000, parallelism=8, overhead_us=250)
    assert limits.ceiling_iops(128 * KiB, 4) == pytest.approx(3200)
    assert limits.ceiling_bytes_per_s(128 * KiB, 4) == pytest.approx(3200 * 131072)


def test_ceiling_saturates_at_parallelism_over_latency() -> None:
    # 16 / 1.25 ms = 12800 IOPS, but 8 slots of 1 ms allow only 8000
    limits = DriveLimits(latency_us=1000, parallelism=8, overhead_us=250)
    assert limits.ceiling_iops(4096, 16) == pytest.approx(8000)
    assert limits.ceiling_iops(4096, 64) == pytest.approx(8000)
    assert limits.saturation_inflight() == pytest.approx(10)


def test_unbounded_parallelism_scales_with_inflight() -> None:
    limits = DriveLimits(latency_us=500)
    assert limits.ceiling_iops(4096, 1) == pytest.approx(2000)
    assert limits.ceiling_iops(4096, 100) == pytest.approx(200_000)
    assert limits.saturation_inflight() == float("inf")


def test_caps_take_the_smallest_term() -> None:
    # 800 IOPS and 200 MB/s: 64K is IOPS-bound, 256K bandwidth-bound
    limits = DriveLimits(bw_bytes_per_s=200 * MB, iops=800)
    assert limits.ceiling_bytes_per_s(64 * KiB, 1) == pytest.approx(800 * 65536)
    assert limits.ceiling_bytes_per_s(256 * KiB, 1) == pytest.approx(200 * MB)
    # latency below both caps wins: qd1 at 10 ms is 100 IOPS
    slow = DriveLimits(latency_us=10_000, bw_bytes_per_s=200 * MB, iops=800)
    assert slow.ceiling_iops(64 * KiB, 1) == pytest.approx(100)


def test_describe_names_every_limit() -> None:
    limits = DriveLimits(latency_us=4000, parallelism=8, bw_bytes_per_s=200 * MB, iops=800)
    assert limits.describe() == "4000 µs per request, 8 at once, 200 MB/s cap, 800 IOPS cap"
    assert DriveLimits(latency_us=50).describe() == "50 µs per request, unbounded parallelism"
    assert DriveLimits().describe() == "no limits"


def test_limits_round_trip_and_load_older_files() -> None:
    limits = DriveLimits(latency_us=1000, parallelism=8, bw_bytes_per_s=200 * MB, iops=800, overhead_us=150)
    assert DriveLimits.from_json(json.loads(json.dumps(limits.to_json()))) == limits
    assert DriveLimits.from_json({"latency_us": 50, "future_key": 1}) == DriveLimits(latency_us=50)


# ---- the real drive ---------------------------------------------------------

def _missing_for_fuse() -> str | None:
    if not Path("/dev/fuse").exists():
        return "needs /dev/fuse (FUSE in the kernel)"
    if shutil.which("cc") is None:
        return "needs a C compiler (cc) for the FUSE daemon: scripts/setup.sh"
    if subprocess.run(["pkg-config", "--exists", "fuse3"], check=False).returncode != 0:
        return "needs the libfuse3 headers (libfuse3-dev, pkg-config): scripts/setup.sh"
    return None


_FUSE_MISSING = _missing_for_fuse() if shutil.which("pkg-config") else "needs pkg-config: scripts/setup.sh"
needs_fuse = pytest.mark.skipif(_FUSE_MISSING is not None, reason=_FUSE_MISSING or "")

L_US, P = 1000, 8
# Two tiers. The main checks are ratios measured within one run (qd N against qd 1 of the same
# drive, a few seconds apart): the machine's load slows both alike, so they hold on a busy machine,
# and they do not depend on the per-request overhead, which load changes. The absolute checks
# against the model are marked drive_model and held at 10 %: a run slower than the model by more
# is repeated (up to RETRIES times, the fastest kept: noise only slows a run), and one faster than
# the model by more fails at once. (Fresh-clone CI runs on a loaded 2-core VM measured 0.86-0.90
# of the model at times: there the drive_model tier fails, and the ratios still hold.)
REL = 0.10
RATIO_REL = 0.10      # a within-run ratio against the model's ratio
RETRIES = 3
ROUNDS = 2            # interleaved rounds of the ratio runs; each queue depth keeps its fastest


@dataclass(frozen=True)
class FioResult:
    iops: float
    bw_bytes_per_s: float
    clat_us: float


def run_fio(target: str, rw: str, bs: int, qd: int, cgroup: str | None = None,
            runtime_s: float = 1.0) -> FioResult:
    argv = ["fio", "--name=t", f"--filename={target}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
            "--ioengine=libaio", f"--iodepth={qd}", "--time_based", f"--runtime={runtime_s}",
            "--ramp_time=0.25", "--output-format=json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True,
                         preexec_fn=(lambda: _join(cgroup)) if cgroup else None)
    job = json.loads(out.stdout)["jobs"][0]["read" if "read" in rw else "write"]
    return FioResult(job["iops"], job["bw_bytes"], job["clat_ns"]["mean"] / 1000)


def _join(cgroup: str) -> None:
    Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))


@pytest.fixture(scope="module")
def drive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedDrive]:
    """L = 1 ms, P = 8, no caps, 4 KiB sectors."""
    directory = tmp_path_factory.mktemp("emulated")
    with emulated_drive(directory, 256 * MiB, DriveLimits(latency_us=L_US, parallelism=P),
                        sector_size=4096) as d:
        yield d


class Runs:
    """fio runs on one drive, one per (rw, queue depth), cached."""

    def __init__(self, drive: EmulatedDrive, bs: int) -> None:
        self.drive, self.bs = drive, bs
        self.runs: dict[tuple[str, int], FioResult] = {}

    def _run(self, qd: int, rw: str) -> FioResult:
        return run_fio(self.drive.device.path, rw, self.bs, qd)

    def rounds(self, qds: tuple[int, ...], rw: str = "randread") -> dict[int, FioResult]:
        """Each queue depth's fastest run of ROUNDS interleaved rounds (1, 4, 8, 1, 4, 8, ...):
        within one run, so the ratios between them hold whatever the machine's load."""
        todo = [qd for qd in qds if (rw, qd) not in self.runs]
        for _ in range(ROUNDS):
            for qd in todo:
                again = self._run(qd, rw)
                best = self.runs.get((rw, qd))
                self.runs[rw, qd] = again if best is None or again.iops > best.iops else best
        return {qd: self.runs[rw, qd] for qd in qds}

    def near(self, qd: int, expected_iops: float, rw: str = "randread") -> FioResult:
        """The drive_model tier's run: repeated while slower than the model by more than REL."""
        best = self.rounds((qd,), rw)[qd]
        for _ in range(RETRIES):
            if best.iops >= (1 - REL) * expected_iops:
                break
            again = self._run(qd, rw)
            best = self.runs[rw, qd] = max(best, again, key=lambda r: r.iops)
        return best


@pytest.fixture(scope="module")
def runs(drive: EmulatedDrive) -> Runs:
    """128K requests."""
    return Runs(drive, 128 * KiB)


# The ratio drive: 10 ms per request, so the per-request round trip outside the permits (70-230 µs on
# an idle machine, up to ~1 ms at qd 1 under heavy load, where each completion waits for a busy CPU
# before the next request goes out) stays within a few percent of a request's time at every depth.
RATIO_L_US = 10_000


@pytest.fixture(scope="module")
def ratio_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """L = 10 ms, P = 8, no caps; 128K requests."""
    with emulated_drive(tmp_path_factory.mktemp("ratio"), 64 * MiB, DriveLimits(latency_us=RATIO_L_US, parallelism=P),
                        sector_size=4096) as d:
        yield Runs(d, 128 * KiB)


@needs_fio
@needs_root
@needs_fuse
def test_throughput_scales_with_queue_depth_up_to_parallelism(ratio_runs: Runs) -> None:
    """Against qd 1 of the same run: up to P in flight, qd N moves N times qd 1's requests (each takes
    the latency); beyond P the rate stops growing (qd 16 gains at most the round trip's share of a
    request on qd 8, where linear would double it; qd 32 ties qd 16), and requests queue: by Little's
    law the latency at qd 32 is twice that at qd 16."""
    got = ratio_runs.rounds((1, 4, 8, 16, 32))
    for qd in (4, 8):
        ratio = got[qd].iops / got[1].iops
        assert abs(ratio / qd - 1) <= RATIO_REL, (qd, ratio)
    assert 1 - RATIO_REL <= got[16].iops / got[8].iops <= 1.5, got[16].iops / got[8].iops
    assert abs(got[32].iops / got[16].iops - 1) <= RATIO_REL, got[32].iops / got[16].iops
    assert abs(got[32].clat_us / got[16].clat_us / 2 - 1) <= RATIO_REL, got[32].clat_us / got[16].clat_us


@needs_fio
@needs_root
@needs_fuse
@pytest.mark.drive_model
def test_qd1_takes_latency_plus_overhead(drive: EmulatedDrive, runs: Runs) -> None:
    """The drive measured its own per-request overhead when it started;
    fio at queue depth 1 then takes latency plus that overhead."""
    overhead_us = drive.limits.overhead_us
    assert 0 < overhead_us < L_US
    assert abs(model_ratio(drive, runs, "randread", 1) - 1) <= REL


@needs_fio
@needs_root
@needs_fuse
@pytest.mark.drive_model
def test_saturated_rate_is_parallelism_over_latency(runs: Runs) -> None:
    saturated = P * 1e6 / L_US
    for qd in (16, 32):
        got = runs.near(qd, saturated).iops
        assert abs(got / saturated - 1) <= REL, (qd, got / saturated)


@needs_fio
@needs_root
@needs_fuse
@pytest.mark.drive_model
def test_model_ceiling_matches_fio(drive: EmulatedDrive, runs: Runs) -> None:
    """The model's ceiling (Little's law with the measured overhead, capped by the permits) within 10 %
    of fio. A write also copies its 128 KiB into the daemon, which the model (its overhead measured on
    reads) leaves out."""
    for rw, qd in (("randread", 1), ("randread", 4), ("randread", 16), ("randwrite", 4)):
        ratio = model_ratio(drive, runs, rw, qd)
        assert abs(ratio - 1) <= REL, (rw, qd, ratio)


def model_ratio(drive: EmulatedDrive, runs: Runs, rw: str, qd: int) -> float:
    """fio's 128 KiB throughput at `qd` over the model's ceiling. The model takes the per-request
    overhead the drive measured at its start; when fio is off by more than REL, the overhead is
    measured again right after fio's run, as the mean of synchronous reads from this process (fio's
    rate is one over its mean request time, and on a busy machine a slow tail moves the mean, not
    the median the drive measures at its start), and the ratio is against the model with it."""
    predicted = drive.limits.ceiling_bytes_per_s(128 * KiB, qd)
    measured = runs.near(qd, predicted / (128 * KiB), rw).bw_bytes_per_s
    if abs(measured / predicted - 1) > REL:
        now = replace(drive.limits, overhead_us=mean_overhead_us(drive))
        predicted = now.ceiling_bytes_per_s(128 * KiB, qd)
    return measured / predicted


def mean_overhead_us(drive: EmulatedDrive, requests: int = 200) -> float:
    """The mean time of `requests` direct 128 KiB reads at queue depth 1 from this process, less the
    emulated latency."""
    buf = mmap.mmap(-1, 128 * KiB)
    fd = os.open(drive.device.path, os.O_RDONLY | os.O_DIRECT)
    try:
        spots = drive.backing.stat().st_size // (128 * KiB)
        start = time.perf_counter()
        for i in range(requests):
            os.preadv(fd, [buf], (i * 7919 % spots) * 128 * KiB)
        elapsed_us = (time.perf_counter() - start) * 1e6
    finally:
        os.close(fd)
        buf.close()
    return elapsed_us / requests - drive.limits.latency_us


@needs_fio
@needs_root
@needs_fuse
def test_parallelism_bounds_the_daemon(drive: EmulatedDrive) -> None:
    """At P in flight requests (almost) never wait for a slot; at 2P each
    waits about one service time. (Almost: anything else reading the device,
    udev say, adds a request now and then.)"""
    def mean_wait_us(qd: int) -> float:
        before = drive.stats()
        run_fio(drive.device.path, "randread", 64 * KiB, qd, runtime_s=1)
        after = drive.stats()
        return (after.wait_ns - before.wait_ns) / 1000 / (after.reads - before.reads)

    at_p, at_2p = mean_wait_us(P), mean_wait_us(2 * P)
    assert at_p < 0.01 * L_US, (at_p, at_2p)
    # ideally L - overhead; more when noise slows the round trips, less when it thins the queue
    assert 0.25 * L_US < at_2p < 1.5 * L_US, (at_p, at_2p)
    assert (drive.stats().latency_ns, drive.stats().parallelism) == (L_US * 1000, P)


@needs_root
@needs_fuse
def test_a_1mib_request_is_one_fuse_op(drive: EmulatedDrive) -> None:
    """Straight to the FUSE file: the loop device's 128-segment limit may
    split a request whose buffer is not physically contiguous, as an NVMe
    drive's would, so that is checked without it."""
    buf = mmap.mmap(-1, MiB)
    fd = os.open(drive.fuse_file, os.O_RDWR | os.O_DIRECT)
    try:
        before = drive.stats()
        os.pwritev(fd, [buf], 3 * MiB)
        os.preadv(fd, [buf], 5 * MiB)
        after = drive.stats()
    finally:
        os.close(fd)
    assert (after.writes - before.writes, after.reads - before.reads) == (1, 1)
    assert after.max_request_bytes == MiB


@needs_root
@needs_fuse
def test_overhead_is_measured_and_small(drive: EmulatedDrive) -> None:
    assert 0 < least_overhead_us(drive) < 0.5 * L_US


def least_overhead_us(drive: EmulatedDrive) -> float:
    """The per-request overhead, measured up to RETRIES times while over half the latency, the
    least kept (the machine's load only ever adds to it)."""
    least = measure_overhead_us(drive, 128 * KiB, requests=50)
    for _ in range(RETRIES):
        if least < 0.5 * L_US:
            break
        least = min(least, measure_overhead_us(drive, 128 * KiB, requests=50))
    return least


@needs_root
@needs_fuse
def test_a_given_overhead_is_kept(tmp_path: Path) -> None:
    with emulated_drive(tmp_path, 64 * MiB, DriveLimits(latency_us=100, parallelism=4, overhead_us=123)) as d:
        assert d.limits.overhead_us == 123


@dataclass(frozen=True)
class CappedRuns:
    limits: DriveLimits
    small: FioResult                 # 64 KiB reads at qd 8: the IOPS cap
    large: FioResult                 # 256 KiB reads at qd 8: the bandwidth cap
    knobs: dict[str, list[str]]
    device_number: str


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> CappedRuns:
    limits = DriveLimits(latency_us=100, parallelism=32, bw_bytes_per_s=200 * MB, iops=800)
    with emulated_drive(tmp_path_factory.mktemp("capped"), 256 * MiB, limits) as d:
        assert d.cgroup is not None
        small = run_fio(d.device.path, "randread", 64 * KiB, 8, cgroup=d.cgroup)
        large = run_fio(d.device.path, "randread", 256 * KiB, 8, cgroup=d.cgroup)
        knobs = {k: Path(d.cgroup, f"blkio.throttle.{k}").read_text().split()
                 for k in ("read_iops_device", "write_iops_device", "read_bps_device", "write_bps_device")}
        return CappedRuns(d.limits, small, large, knobs, d.device.number)


@needs_fio
@needs_root
@needs_fuse
def test_iops_and_bandwidth_caps(capped: CappedRuns) -> None:
    """The caps are set on the device, and within one run they bind in the model's ratio: 256 KiB
    requests reach 200 MB/s, 64 KiB ones 800 IOPS x 64 KiB (52.4 MB/s), 3.81 times less."""
    assert capped.knobs["read_iops_device"] == [capped.device_number, "800"]
    assert capped.knobs["write_bps_device"] == [capped.device_number, str(200 * MB)]
    ratio = capped.large.bw_bytes_per_s / capped.small.bw_bytes_per_s
    assert ratio == pytest.approx(200 * MB / (800 * 64 * KiB), rel=REL)


@needs_fio
@needs_root
@needs_fuse
@pytest.mark.drive_model
def test_iops_and_bandwidth_caps_as_the_model_says(capped: CappedRuns) -> None:
    assert capped.small.iops == pytest.approx(800, rel=REL)
    assert capped.small.bw_bytes_per_s == pytest.approx(capped.limits.ceiling_bytes_per_s(64 * KiB, 8), rel=REL)
    assert capped.large.bw_bytes_per_s == pytest.approx(200 * MB, rel=REL)
    assert capped.large.bw_bytes_per_s == pytest.approx(capped.limits.ceiling_bytes_per_s(256 * KiB, 8), rel=REL)


@needs_root
@needs_fuse
@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_filesystem_takes_direct_writes(tmp_path: Path, fstype: str) -> None:
    with emulated_drive(tmp_path, 320 * MiB, DriveLimits(latency_us=100, parallelism=16),
                        fstype=fstype, sector_size=4096) as d:
        assert d.mount_point is not None and d.path == d.mount_point
        before = d.stats()
        target = d.path / "swap.tensor"
        buf = mmap.mmap(-1, MiB)
        buf.write(b"\x5a" * MiB)
        fd = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
        try:
            assert os.pwritev(fd, [buf], 0) == MiB
        finally:
            os.close(fd)
        assert target.read_bytes() == b"\x5a" * MiB
        assert d.stats().write_bytes - before.write_bytes >= MiB


def _leftovers(d: EmulatedDrive) -> list[str]:
    """What of `d` is still there after it was torn down."""
    found = []
    mounts = Path("/proc/mounts").read_text()
    if str(d.fuse_file.parent) in mounts or (d.mount_point and str(d.mount_point) in mounts):
        found.append("mount")
    loops = subprocess.run(["losetup", "-l", "-n", "-O", "BACK-FILE"], capture_output=True, text=True).stdout
    if str(d.fuse_file.parent) in loops:
        found.append("loop device")
    if d.cgroup and Path(d.cgroup).exists():
        found.append("cgroup")
    if Path(f"/proc/{d.daemon_pid}").exists():
        found.append("daemon")
    if d.backing.parent.exists():
        found.append("files")
    return found


@needs_root
@needs_fuse
@pytest.mark.parametrize("error", [None, RuntimeError, KeyboardInterrupt])
def test_nothing_left_behind(tmp_path: Path, error: type[BaseException] | None) -> None:
    limits = DriveLimits(latency_us=50, parallelism=4, bw_bytes_per_s=100 * MB, iops=5000)
    seen: list[EmulatedDrive] = []
    with pytest.raises(error) if error else contextlib.nullcontext():
        with emulated_drive(tmp_path, 64 * MiB, limits, fstype="ext4") as d:
            seen.append(d)
            assert _leftovers(d) == ["mount", "loop device", "cgroup", "daemon", "files"]
            if error:
                raise error()
    assert _leftovers(seen[0]) == []
    assert list(tmp_path.iterdir()) == []


CTRL_C_CHILD = """
import json, sys, time
from pathlib import Path
from iotune.model.drive import DriveLimits
from iotune.volumes.emulated import emulated_drive
limits = DriveLimits(latency_us=50, parallelism=4, iops=5000)
with emulated_drive(Path(sys.argv[1]), 64 << 20, limits, fstype="ext4") as d:
    print(json.dumps([str(d.backing), str(d.fuse_file), d.cgroup, d.daemon_pid, str(d.mount_point)]), flush=True)
    time.sleep(60)
"""


def _default_sigint() -> None:
    """In the child before it execs: SIGINT back to its default, which
    Python turns into KeyboardInterrupt. A suite started as a background job
    of a non-interactive shell inherits SIGINT ignored, and Python leaves an
    ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@needs_root
@needs_fuse
def test_ctrl_c_to_the_process_group_cleans_up(tmp_path: Path) -> None:
    """As a terminal's Ctrl-C does: SIGINT to the whole foreground group.
    The daemon runs in a session of its own, so it is stopped in order,
    after the filesystem and the loop device are gone."""
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, process_group=0, preexec_fn=_default_sigint)
    assert child.stdout is not None
    backing, fuse_file, cgroup, pid, mount_point = json.loads(child.stdout.readline())
    os.killpg(child.pid, signal.SIGINT)
    _, stderr = child.communicate(timeout=30)
    assert "KeyboardInterrupt" in stderr and "Error" not in stderr.replace("KeyboardInterrupt", "")
    d = EmulatedDrive(BlockDevice(0, 0, "gone"), Path(mount_point), cgroup, DriveLimits(), Path(backing),
                      Path(fuse_file), pid, Path(mount_point))
    assert _leftovers(d) == []
    assert list(tmp_path.iterdir()) == []


def test_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PrivilegeError, match="emulated drives need root"):
        with emulated_drive(None, 64 * MiB, DriveLimits()):
            pass


@needs_root
def test_rejects_bad_requests() -> None:
    with pytest.raises(UsageError, match="unknown filesystem 'zfs'"):
        with emulated_drive(None, 64 * MiB, DriveLimits(), fstype="zfs"):
            pass
    with pytest.raises(UsageError, match="not a positive multiple of 4096"):
        with emulated_drive(None, 1000, DriveLimits()):
            pass


def test_missing_compiler_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(IotuneError, match=r"no C compiler \(cc\).*apt-get install gcc libfuse3-dev fuse3 pkg-config"):
        build_daemon(tmp_path / "cache")
