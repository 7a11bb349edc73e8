"""Emulated drives: a loop device that behaves like an NVMe drive with known
limits (iotune.model.drive.DriveLimits), which sweeps, tests and benchmarks
can check their results against.

The stack, bottom up:
  backing file     a sparse regular file holding the data
  FUSE daemon      fusedrive/latency_drive.c, serving one file, "disk": each
                   request takes `latency_us`, at most `parallelism` at once
  loop device      `losetup --direct-io=on` over that file (without direct
                   I/O the loop device serializes and reads hit the page cache)
  blkio cgroup     optional bandwidth and IOPS caps on the loop device, for
                   the processes put in it (`EmulatedDrive.cgroup`)
  filesystem       optional, made and mounted on the loop device

The daemon is compiled on first use into ~/.cache/iotune (keyed by a hash of
its source and flags). What the daemon cannot emulate is the round trip
through the block layer, the loop device and FUSE: each request costs some
more than `latency_us`, without holding a parallelism slot. It is no
constant: for 128 KiB requests it measured 70, 156 and 233 µs at a latency
of 0.1, 1 and 4 ms on this project's machine (idle CPUs; less when they are
busy), and 350-700 µs at 1 MiB. So it is measured when the drive starts
(`measure_overhead_us`: queue-depth-1 reads of OVERHEAD_BLOCK_BYTES, less
`latency_us`) and carried in the yielded `limits.overhead_us`, and
`limits.ceiling_bytes_per_s` predicts what fio measures (there within 4%). Copying data costs
CPU: on 2 cores the drive tops out near 3 GB/s whatever its limits say.

Everything is undone on exit, error or Ctrl-C: filesystem, cgroup, loop
device, daemon and FUSE mount, and the files it made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import mmap
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..fs import mountinfo
from ..host.cgroup import Throttle, blkio_cgroup
from ..blockdev.devices import BlockDevice
from ..host.ledger import note, note_process
from ..host.proc import terminate
from ..errors import IotuneError, UsageError
from ..model.drive import DriveLimits
from .parts import MKFS, attach_loop, create_file, format_and_mount, require_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fusedrive") / "latency_drive.c"
BUILD_FIX = "apt-get install gcc libfuse3-dev fuse3 pkg-config (or run scripts/setup.sh)"
OVERHEAD_BLOCK_BYTES = 128 << 10   # request size of the start-up overhead measurement
OVERHEAD_BUDGET_S = 0.25           # about how long that measurement may take
OVERHEAD_REQUESTS = (20, 100)      # fewest and most requests it times
MAX_THREADS = 256              # daemon threads: one per request in the daemon
MOUNT_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
WARMUP_REQUESTS = 10


@dataclass(frozen=True)
class DaemonStats:
    """The daemon's counters, read from its "stats" file."""

    reads: int = 0
    writes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    max_request_bytes: int = 0    # the largest single FUSE request seen
    max_inflight: int = 0         # most requests in the daemon at once
    wait_ns: int = 0              # total time requests queued for a free slot
    latency_ns: int = 0
    parallelism: int = 0


@dataclass(frozen=True)
class EmulatedDrive:
    device: BlockDevice
    path: Path                 # the mount point with a filesystem, else the device node
    cgroup: str | None         # processes in it get the bandwidth and IOPS caps
    limits: DriveLimits        # as asked for; overhead_us measured at start unless given
    backing: Path              # the regular file holding the data
    fuse_file: Path            # the FUSE file the loop device sits on
    daemon_pid: int
    mount_point: Path | None   # set when a filesystem was made

    def stats(self) -> DaemonStats:
        return read_stats(self.fuse_file.parent / "stats")


def read_stats(path: Path) -> DaemonStats:
    """The daemon's counters from its stats file (`name value` lines)."""
    values = dict(line.split() for line in path.read_text().splitlines() if line.strip())
    names = {f.name for f in dataclasses.fields(DaemonStats)}
    return DaemonStats(**{k: int(v) for k, v in values.items() if k in names})


@contextlib.contextmanager
def emulated_drive(directory: Path | None, size_bytes: int, limits: DriveLimits,
                   fstype: str | None = None, sector_size: int = 512,
                   cache_dir: Path | None = None) -> Iterator[EmulatedDrive]:
    """A loop device with `limits` over a file in `directory` (default: the
    temporary directory); with `fstype`, also formatted and mounted."""
    require_root("emulated drives")
    check_request(size_bytes, limits, fstype, sector_size)
    binary = build_daemon(cache_dir)
    with contextlib.ExitStack() as stack:
        drive_dir = new_drive_dir(stack, directory)
        backing = drive_dir / "backing.img"
        create_file(stack, backing, size_bytes)
        fuse_dir = make_dir(stack, drive_dir / "fuse")
        proc = start_daemon(stack, binary, backing, fuse_dir, limits, drive_dir / "daemon.log")
        fuse_file = fuse_dir / "disk"
        device = attach_loop(stack, fuse_file, sector_size)
        _check_direct_io(device)
        overhead_us = limits.overhead_us or _startup_overhead_us(device, size_bytes, limits.latency_us)
        capped = limits.bw_bytes_per_s > 0 or limits.iops > 0
        cgroup = stack.enter_context(blkio_cgroup(device.name, [throttle(device, limits)])) if capped else None
        mount_point = format_and_mount(stack, device, drive_dir, fstype) if fstype else None
        model = dataclasses.replace(limits, overhead_us=overhead_us)
        yield EmulatedDrive(device, mount_point or Path(device.path), str(cgroup) if cgroup else None,
                            model, backing, fuse_file, proc.pid, mount_point)


def throttle(device: BlockDevice, limits: DriveLimits) -> Throttle:
    """The blkio caps of `limits` on `device`, the same in each direction."""
    bw, iops = limits.bw_bytes_per_s, limits.iops
    return Throttle(device.number, read_bps=bw, write_bps=bw, read_iops=iops, write_iops=iops)


def check_request(size_bytes: int, limits: DriveLimits, fstype: str | None, sector_size: int) -> None:
    if fstype is not None and fstype not in MKFS:
        raise UsageError(f"unknown filesystem '{fstype}': choose one of {', '.join(MKFS)}")
    if sector_size not in (512, 1024, 2048, 4096):
        raise UsageError(f"sector size {sector_size} is not one of 512, 1024, 2048, 4096")
    if size_bytes <= 0 or size_bytes % 4096:
        raise UsageError(f"drive size {size_bytes} bytes is not a positive multiple of 4096")
    if limits.latency_us < 0 or limits.parallelism < 0 or limits.bw_bytes_per_s < 0 or limits.iops < 0:
        raise UsageError(f"drive limits must not be negative: {limits}")
    if not Path("/dev/fuse").exists():
        raise IotuneError("no /dev/fuse: this kernel has no FUSE, so emulated drives cannot run here; "
                          "use a scratch drive (bandwidth caps only) instead")


def build_daemon(cache_dir: Path | None = None) -> Path:
    """The compiled FUSE daemon, built on first use and cached by a hash of
    its source and compiler flags."""
    if shutil.which("cc") is None:
        raise IotuneError(f"no C compiler (cc) to build the emulated drive's FUSE daemon: {BUILD_FIX}")
    flags = _fuse_flags()
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "iotune"
    binary = cache / f"latency_drive-{key}"
    if binary.exists():
        return binary
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise IotuneError(f"cannot create the build cache {cache} ({e.strerror}): "
                          f"set XDG_CACHE_HOME to a writable directory") from None
    tmp = cache / f".{binary.name}.{os.getpid()}"
    out = subprocess.run(["cc", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), *flags],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise IotuneError(f"cannot compile the emulated drive's FUSE daemon ({BUILD_FIX}): "
                          f"{out.stderr.strip()[-800:]}")
    os.replace(tmp, binary)
    log.info("built %s", binary)
    return binary


def _fuse_flags() -> list[str]:
    if shutil.which("pkg-config") is None:
        raise IotuneError(f"pkg-config is missing, needed to build the emulated drive's FUSE daemon: {BUILD_FIX}")
    out = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise IotuneError(f"the libfuse3 headers are missing, needed to build the emulated drive's "
                          f"FUSE daemon: {BUILD_FIX}")
    return out.stdout.split()


def new_drive_dir(stack: contextlib.ExitStack, directory: Path | None) -> Path:
    """A fresh directory for this drive's files inside `directory`. Removed
    with rmdir only, so nothing is deleted through a mount left behind."""
    parent = directory or Path(tempfile.gettempdir())
    if not parent.is_dir():
        raise UsageError(f"--dir {parent} is not a directory: create it or choose another")
    drive_dir = Path(tempfile.mkdtemp(prefix="iotune-emulated-", dir=parent)).resolve()
    note(stack, "dir", path=drive_dir)
    stack.callback(_remove_dir, drive_dir)
    return drive_dir


def make_dir(stack: contextlib.ExitStack, path: Path) -> Path:
    path.mkdir()
    note(stack, "dir", path=path)
    stack.callback(_remove_dir, path)
    return path


def _remove_dir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)


def start_daemon(stack: contextlib.ExitStack, binary: Path, backing: Path, mount_dir: Path,
                  limits: DriveLimits, log_path: Path, tree: bool = False) -> subprocess.Popen[bytes]:
    """The daemon, in the foreground as our child in a session of its own
    (so a terminal's Ctrl-C reaches us, and we stop it in order), mounted.
    `tree`: `backing` is a directory served as a whole tree (tree mode)."""
    threads = f"max_threads={MAX_THREADS},max_idle_threads={MAX_THREADS}"
    fsname = "iotune-fusebed" if tree else "iotune-emulated"
    argv = [str(binary), "-f", "-o", f"{threads},fsname={fsname},subtype=iotune",
            f"--backing-dir={backing}" if tree else f"--backing={backing}", f"--latency-ns={round(limits.latency_us * 1000)}",
            f"--parallelism={limits.parallelism}", str(mount_dir)]
    with log_path.open("xb") as err:
        note(stack, "file", path=log_path)
        stack.callback(log_path.unlink, True)
        note(stack, "mount", target=mount_dir)         # before: the mount point is ours
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                start_new_session=True)
    note_process(stack, proc.pid, "the emulated drive's FUSE daemon")
    stack.callback(_stop_daemon, proc, mount_dir)
    _wait_mounted(proc, mount_dir, log_path)
    return proc


def _wait_mounted(proc: subprocess.Popen[bytes], mount_dir: Path, log_path: Path) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not mountinfo.is_mount_point(mount_dir):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = log_path.read_text(errors="replace").strip()[-500:] or "no output"
            raise IotuneError(f"the emulated drive's FUSE daemon did not mount {mount_dir} "
                              f"(exit status {proc.poll()}): {why}; check that /dev/fuse is usable")
        time.sleep(0.01)


def _stop_daemon(proc: subprocess.Popen[bytes], mount_dir: Path) -> None:
    """SIGTERM (the daemon unmounts and exits), SIGKILL if it hangs, and a
    lazy unmount if its mount outlives it."""
    if terminate(proc, STOP_TIMEOUT_S):
        log.warning("FUSE daemon %d ignored SIGTERM; killed it", proc.pid)
    if mountinfo.is_mount_point(mount_dir):
        subprocess.run(["umount", "-l", str(mount_dir)], capture_output=True, check=False)


def _check_direct_io(device: BlockDevice) -> None:
    dio = Path("/sys/block") / device.name / "loop" / "dio"
    if dio.read_text().strip() != "1":
        raise IotuneError(f"{device.path} could not use direct I/O on the FUSE file, so it would serialize "
                          f"requests: check that the kernel's FUSE supports O_DIRECT (Linux >= 6.x)")


def measure_overhead_us(drive: EmulatedDrive, block_size: int = OVERHEAD_BLOCK_BYTES,
                        requests: int = 100) -> float:
    """What the block layer, loop device and FUSE add to each request (µs):
    the median latency of `requests` direct reads of `block_size` from the
    loop device at queue depth 1, less the emulated latency. Run from this
    process, so outside the drive's cgroup and its caps."""
    size_bytes = drive.backing.stat().st_size
    return _median_qd1_us(drive.device.path, size_bytes, block_size, requests) - drive.limits.latency_us


def _startup_overhead_us(device: BlockDevice, size_bytes: int, latency_us: float) -> float:
    """The per-request overhead, measured on the fresh drive within about
    OVERHEAD_BUDGET_S (fewer requests when each takes long)."""
    fewest, most = OVERHEAD_REQUESTS
    guess_us = latency_us + 150                 # only to fit the budget
    requests = max(fewest, min(most, int(OVERHEAD_BUDGET_S * 1e6 / guess_us)))
    overhead_us = _median_qd1_us(device.path, size_bytes, OVERHEAD_BLOCK_BYTES, requests) - latency_us
    log.info("%s: %.0f µs per-request overhead (median of %d reads of %d KiB at qd 1)",
             device.path, overhead_us, requests, OVERHEAD_BLOCK_BYTES >> 10)
    return max(overhead_us, 0.0)


def _median_qd1_us(path: str, size_bytes: int, block_size: int, requests: int) -> float:
    """The median time of `requests` O_DIRECT reads of `block_size` from
    `path`, one at a time, after WARMUP_REQUESTS left out (the daemon's
    threads touching fresh buffers)."""
    if block_size <= 0 or block_size % 4096 or size_bytes < block_size:
        raise UsageError(f"block size {block_size} must be a multiple of 4096 within the drive")
    spots = size_bytes // block_size
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, block_size)
    latencies_ns = []
    try:
        for i in range(WARMUP_REQUESTS + requests):
            start = time.perf_counter_ns()
            os.preadv(fd, [buf], (i % spots) * block_size)
            latencies_ns.append(time.perf_counter_ns() - start)
    finally:
        buf.close()
        os.close(fd)
    return statistics.median(latencies_ns[WARMUP_REQUESTS:]) / 1000
