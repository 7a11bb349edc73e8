"""Test beds: named emulated drives (iotune.model.drive.DriveLimits, one or
several striped) on which DeepSpeed's aio settings matter in a known way,
and the bandwidth each aio setting should reach there by Little's law.

An aio setting keeps `queue_depth` requests of `block_size` bytes in flight
per thread, `threads` (intra_op_parallelism) threads at once: R = qd x
threads requests. Below the block size limits of the stack each request is
one request to the daemon, and a drive of latency L (plus the measured
per-request overhead o) and parallelism P then serves

    bytes/s = bs x min(R / (L + o), P / L)

capped by the bandwidth cap and by the IOPS cap x bs. Larger requests are
split on the way down: the loop device takes at most 128 segments per
request, which for user buffers that are not physically contiguous (fio's,
DeepSpeed's pinned ones) is 128 x 4 KiB = REQUEST_SPLIT_BYTES (512 KiB),
below its max_sectors_kb of 1280 and FUSE's 1 MiB per operation. So each
aio request becomes `daemon_ops(bs)` operations served in parallel: the
request takes L + o while they fit in P, and the operations, not the
requests, fill P (and count against an IOPS cap). Measured through ext4
here: 1 MiB requests arrive as one or two operations (as the buffer's pages
happen to be contiguous or not), 4 MiB as about eight; the model takes the
split. This matters only where P binds, and no bed's telling setting is there.
Each bed is built so that its behaviour shows where P is not the limit.

A striped bed is RAID0 over `drives` such drives (btrfs raid0, 64 KiB
stripe): a request of bs bytes keeps min(drives, bs / 64 KiB) members busy
for L + o, so in flight R requests give R x bs / (L + o), up to `drives`
times one member's caps: to use the members, in-flight requests must scale
with their count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .drive import US_PER_S, DriveLimits
from .record import from_fields

REQUEST_SPLIT_BYTES = 512 << 10       # loop: 128 segments x 4 KiB pages
STRIPE_BYTES = 64 << 10                # btrfs raid0 data stripe


def daemon_ops(block_size: int) -> int:
    """Daemon operations (and loop-device requests) one aio request of
    `block_size` bytes becomes."""
    return max(1, math.ceil(block_size / REQUEST_SPLIT_BYTES))


@dataclass(frozen=True)
class AioPoint:
    """The aio settings Little's law needs: block size, queue depth, threads."""

    block_size: int = 1 << 20
    queue_depth: int = 8
    threads: int = 1

    def label(self) -> str:
        bs = self.block_size
        size = f"{bs >> 20}M" if bs >= 1 << 20 and bs % (1 << 20) == 0 else f"{bs >> 10}K"
        return f"{size} qd{self.queue_depth} t{self.threads}"


DEEPSPEED_DEFAULT_POINT = AioPoint()          # DeepSpeed's aio defaults: 1 MiB, qd 8, 1 thread


@dataclass(frozen=True)
class BedSpec:
    name: str
    summary: str                       # one line: what it stands for and what it shows
    stands_for: str                    # what real storage the bed stands in for
    behaviour: str                     # what it shows about aio settings
    cannot_show: str                   # what it cannot show
    member: DriveLimits                # each drive's limits (overhead measured at start)
    drives: int = 1                    # > 1: RAID0 (btrfs raid0) over that many
    fstype: str = "ext4"
    mount_options: tuple[str, ...] = ("noatime",)
    size_bytes: int = 1 << 30          # per drive
    showcase: tuple[AioPoint, ...] = field(default_factory=tuple)   # settings its table and tests use

    def expected_bytes_per_s(self, point: AioPoint) -> float:
        """What `point` should reach here in one direction (bytes/s)."""
        m, bs = self.member, point.block_size
        inflight = max(point.queue_depth, 0) * max(point.threads, 0)
        members = min(self.drives, max(1, bs // STRIPE_BYTES)) if self.drives > 1 else 1
        share = math.ceil(bs / members)             # bytes each busy member serves per request
        terms = []
        if m.latency_us > 0:
            terms.append(inflight * bs * US_PER_S / (m.latency_us + m.overhead_us))
            if m.parallelism > 0:     # the operations of in-flight requests fill each member's P
                ops = daemon_ops(share)
                terms.append(m.parallelism * US_PER_S / m.latency_us / ops * share * self.drives)
        if m.bw_bytes_per_s > 0:
            terms.append(float(m.bw_bytes_per_s * self.drives))
        if m.iops > 0:
            terms.append(float(m.iops * share / daemon_ops(share) * self.drives))
        return min(terms) if terms else float("inf")

    def ceiling_bytes_per_s(self) -> float:
        """The best any setting can reach: the caps over all members, else
        every permit busy with REQUEST_SPLIT_BYTES operations."""
        m = self.member
        caps = [float(m.bw_bytes_per_s * self.drives)] if m.bw_bytes_per_s > 0 else []
        if m.latency_us > 0 and m.parallelism > 0:
            caps.append(m.parallelism * US_PER_S / m.latency_us * REQUEST_SPLIT_BYTES * self.drives)
        return min(caps) if caps else float("inf")

    def default_share(self) -> float:
        """DeepSpeed's defaults' expected bandwidth / the ceiling."""
        return self.expected_bytes_per_s(DEEPSPEED_DEFAULT_POINT) / self.ceiling_bytes_per_s()

    def with_overhead(self, overhead_us: float) -> BedSpec:
        return replace(self, member=replace(self.member, overhead_us=overhead_us))

    def describe(self) -> str:
        striped = f"RAID0 over {self.drives} drives, each " if self.drives > 1 else ""
        return f"{striped}{self.member.describe()}; {self.fstype} ({','.join(self.mount_options)})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, "stands_for": self.stands_for, "behaviour": self.behaviour,
                "cannot_show": self.cannot_show, "member": self.member.to_json(), "drives": self.drives,
                "fstype": self.fstype, "mount_options": list(self.mount_options), "size_bytes": self.size_bytes,
                "showcase": [vars(p) for p in self.showcase]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BedSpec:
        kw = dict(data)
        kw["member"] = DriveLimits.from_json(data.get("member", {}))
        kw["mount_options"] = tuple(data.get("mount_options", ("noatime",)))
        kw["showcase"] = tuple(from_fields(AioPoint, p) for p in data.get("showcase", ()))
        return from_fields(cls, kw)
