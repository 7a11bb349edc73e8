"""Named test beds: emulated drives (volumes.emulated) with limits chosen so
that DeepSpeed's aio settings matter in a known way, each brought up by one
context manager (`running_bed`) as a mounted directory, its loop device(s),
the blkio cgroup holding the caps, and the expected bandwidth of every aio
setting (iotune.model.bed.BedSpec.expected_bytes_per_s).

The limits are scaled to what a 2-core machine sustains through the FUSE
daemon (it measured 800 MB/s of 1 MiB requests with CPU to spare): a real
parallel filesystem has 10-100x the bandwidth at 1/10-1/20 of the latency,
but the same bandwidth-delay product relative to DeepSpeed's default
8 x 1 MiB in flight, and that product is what decides the tuning.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..host.cgroup import blkio_cgroup
from ..blockdev.devices import BlockDevice
from ..host.ledger import note
from ..host.proc import running
from ..errors import UsageError
from ..model.bed import DEEPSPEED_DEFAULT_POINT as DEFAULT
from ..model.bed import AioPoint, BedSpec
from ..model.drive import DriveLimits
from ..model.layout import LayoutSpec
from .emulated import EmulatedDrive, emulated_drive, throttle
from .layout import build_layout

KiB, MiB, MB = 1 << 10, 1 << 20, 1_000_000

BEDS: dict[str, BedSpec] = {b.name: b for b in (
    BedSpec(
        name="builtin",
        summary="small NVMe drive behind 200 MB/s and 800 IOPS caps, the defaults saturate it",
        stands_for="a small NVMe drive behind bandwidth and IOPS caps (the sweep's default drive)",
        behaviour="block size matters (800 IOPS cap: 128K reaches half the bandwidth); DeepSpeed's "
                  "defaults (1M, qd 8) already reach the 200 MB/s cap",
        cannot_show="a gain over DeepSpeed's defaults: they saturate it",
        member=DriveLimits(latency_us=4000.0, parallelism=8, bw_bytes_per_s=200 * MB, iops=800),
        showcase=(DEFAULT, AioPoint(128 * KiB, 8), AioPoint(256 * KiB, 8))),
    BedSpec(
        name="latency-bound",
        summary="network/parallel filesystem or cloud volume: 40 ms, 64 at once, 600 MB/s, the defaults reach a third",
        stands_for="a network or parallel filesystem, or a cloud volume: long per-request latency, "
                   "deep parallelism (bandwidth-delay product 24 MB, three times DeepSpeed's 8 MiB in flight)",
        behaviour="in-flight bytes decide: DeepSpeed's defaults (8 x 1 MiB) reach about a third of "
                  "the 600 MB/s cap; qd 32 (or larger blocks) reaches it",
        cannot_show="per-request CPU costs of a real network client, or latency that varies with load",
        member=DriveLimits(latency_us=40_000.0, parallelism=64, bw_bytes_per_s=600 * MB),
        showcase=(DEFAULT, AioPoint(MiB, 16), AioPoint(MiB, 32))),
    BedSpec(
        name="striped",
        summary="RAID0 over 3 latency-bound drives of 200 MB/s, queue depth must scale with the members",
        stands_for="RAID0 over several latency-bound drives (btrfs raid0, 64 KiB stripe; md RAID is "
                   "absent here), as several NVMe drives or volumes behind one nvme_path",
        behaviour="each member caps at 200 MB/s: DeepSpeed's defaults reach about one member's worth, "
                  "qd 32 all three (600 MB/s); in-flight requests must scale with the member count",
        cannot_show="md RAID or a chunk size other than btrfs's fixed 64 KiB",
        member=DriveLimits(latency_us=40_000.0, parallelism=64, bw_bytes_per_s=200 * MB),
        drives=3, fstype="btrfs", mount_options=("noatime", "nodatacow"), size_bytes=512 * MiB,
        showcase=(DEFAULT, AioPoint(MiB, 32))),
    BedSpec(
        name="iops-bound",
        summary="400 IOPS and 200 MB/s caps: small blocks lose, the defaults are fine",
        stands_for="a drive or volume with an IOPS limit (provisioned-IOPS cloud volumes)",
        behaviour="small blocks cannot reach the bandwidth (400 IOPS x 64K = 26 MB/s); 512K and up "
                  "reach the 200 MB/s cap, DeepSpeed's 1 MiB default included",
        cannot_show="a gain over DeepSpeed's defaults, or queue-depth effects (latency is short)",
        member=DriveLimits(latency_us=500.0, parallelism=32, bw_bytes_per_s=200 * MB, iops=400),
        showcase=(DEFAULT, AioPoint(64 * KiB, 8), AioPoint(256 * KiB, 8))),
    BedSpec(
        name="bandwidth-only",
        summary="200 MB/s cap only: every sensible setting ties, nothing to gain",
        stands_for="a drive whose bandwidth, not latency or IOPS, is the limit (a local SSD at its "
                   "sequential rate)",
        behaviour="every sensible setting ties at the 200 MB/s cap: the defaults already saturate it, "
                  "there is nothing to gain",
        cannot_show="any difference between sensible settings, by design",
        member=DriveLimits(latency_us=100.0, parallelism=32, bw_bytes_per_s=200 * MB),
        showcase=(DEFAULT, AioPoint(256 * KiB, 4), AioPoint(4 * MiB, 8))),
)}
DEFAULT_BED = "builtin"


def bed_spec(name: str) -> BedSpec:
    if name not in BEDS:
        raise UsageError(f"unknown test bed '{name}': choose one of {', '.join(BEDS)}")
    return BEDS[name]


@dataclass(frozen=True)
class Bed:
    """A bed that is up: where to do I/O, its devices and caps, its model."""

    spec: BedSpec                 # with the overhead measured at start
    path: Path                    # the mounted directory
    devices: tuple[BlockDevice, ...]
    cgroup: str | None            # processes in it get the caps
    drives: tuple[EmulatedDrive, ...]

    @property
    def ceiling_bytes_per_s(self) -> float:
        return self.spec.ceiling_bytes_per_s()

    def expected_bytes_per_s(self, point: AioPoint) -> float:
        return self.spec.expected_bytes_per_s(point)


@contextlib.contextmanager
def running_bed(name: str, directory: Path | None = None, size_bytes: int | None = None) -> Iterator[Bed]:
    """Bring up the bed `name` (drives, caps, filesystem, mount) in
    `directory` (default: the temporary directory), each drive of
    `size_bytes` (default: the bed's; a sparse file, so only what is written
    takes disk space); all of it is removed on exit, error or Ctrl-C."""
    spec = bed_spec(name)
    if size_bytes is not None:
        spec = replace(spec, size_bytes=size_bytes)
    if spec.drives == 1:
        with emulated_drive(directory, spec.size_bytes, spec.member, fstype=spec.fstype) as d:
            yield Bed(spec.with_overhead(d.limits.overhead_us), d.path, (d.device,), d.cgroup, (d,))
        return
    with contextlib.ExitStack() as stack:
        uncapped = replace(spec.member, bw_bytes_per_s=0, iops=0)     # one cgroup caps all members
        drives = tuple(stack.enter_context(emulated_drive(directory, spec.size_bytes, uncapped))
                       for _ in range(spec.drives))
        cgroup = stack.enter_context(blkio_cgroup(f"bed-{name}", [throttle(d.device, spec.member) for d in drives]))
        mnt = Path(tempfile.mkdtemp(prefix=f"iotune-bed-{name}-", dir=directory))
        note(stack, "dir", path=mnt.resolve())
        stack.callback(_rmdir, mnt)
        layout = LayoutSpec(devices=tuple(d.device.path for d in drives), raid0=True, backend="btrfs",
                            fstype=spec.fstype, mount_options=spec.mount_options)
        vol = stack.enter_context(build_layout(layout, mnt, scratch=True))
        overhead_us = statistics.mean(d.limits.overhead_us for d in drives)
        yield Bed(spec.with_overhead(overhead_us), vol.path, tuple(d.device for d in drives), str(cgroup), drives)


def bed_trouble(bed: Bed) -> str | None:
    """What is wrong with a bed that is up, from outside its I/O path (a
    stat on a dead FUSE mount can hang): a drive whose FUSE daemon is gone
    fails every request with an I/O error. None when nothing is known."""
    for d in bed.drives:
        if not running(d.daemon_pid):
            return (f"the emulated drive {d.device.path} of test bed {bed.spec.name} is gone: its FUSE daemon "
                    f"(pid {d.daemon_pid}) has exited, so every request to the drive fails")
    return None


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()
