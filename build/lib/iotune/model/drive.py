"""The known limits of an emulated drive, and the throughput they allow.

A drive serves each request in `latency_us` with at most `parallelism`
requests in service at once, optionally behind a bandwidth cap and an IOPS
cap (both apply to reads and writes separately, as cgroup v1 blkio does).

`overhead_us` is the fixed cost of one request outside the emulated service
time (block layer, loop device, FUSE round trip): it is not emulated, it is
measured. It lengthens each request's latency but does not hold one of the
`parallelism` permits, so by Little's law

    IOPS = min(inflight / (latency + overhead), parallelism / latency)

i.e. below saturation every request takes latency + overhead, and once all
permits are busy the permits alone set the rate. A latency of 0 means no
latency term at all (the drive is then limited by the caps only).
"""

from __future__ import annotations

from dataclasses import dataclass

from .record import JsonRecord

US_PER_S = 1_000_000


@dataclass(frozen=True)
class DriveLimits(JsonRecord):
    latency_us: float = 0.0       # service time of one request
    parallelism: int = 0          # requests in service at once; 0 = unbounded
    bw_bytes_per_s: int = 0       # bandwidth cap per direction; 0 = none
    iops: int = 0                 # IOPS cap per direction; 0 = none
    overhead_us: float = 0.0      # measured per-request cost outside the service time

    def latency_iops(self, inflight: int) -> float:
        """The IOPS that latency and parallelism allow at `inflight` requests
        (infinite without a latency)."""
        if self.latency_us <= 0:
            return float("inf")
        busy = max(inflight, 0)
        rate = busy * US_PER_S / (self.latency_us + self.overhead_us)
        if self.parallelism > 0:
            rate = min(rate, self.parallelism * US_PER_S / self.latency_us)
        return rate

    def ceiling_iops(self, block_size: int, inflight: int) -> float:
        """The IOPS the drive allows for `block_size`-byte requests."""
        return self.ceiling_bytes_per_s(block_size, inflight) / block_size

    def ceiling_bytes_per_s(self, block_size: int, inflight: int) -> float:
        """The throughput ceiling, in bytes/s, for `inflight` concurrent
        `block_size`-byte requests in one direction: the smallest of the
        bandwidth cap, the IOPS cap times the block size, and Little's law
        (see the module docstring). Infinite for a drive without limits."""
        terms = [self.latency_iops(inflight) * block_size]
        if self.bw_bytes_per_s > 0:
            terms.append(float(self.bw_bytes_per_s))
        if self.iops > 0:
            terms.append(float(self.iops * block_size))
        return min(terms)

    def saturation_inflight(self) -> float:
        """Requests in flight at which the permits are all busy:
        parallelism x (latency + overhead) / latency (infinite if unbounded)."""
        if self.parallelism <= 0 or self.latency_us <= 0:
            return float("inf")
        return self.parallelism * (self.latency_us + self.overhead_us) / self.latency_us

    def describe(self) -> str:
        """One line for people: '1000 µs per request, 8 at once, 200 MB/s
        cap, 800 IOPS cap' (MB/s decimal); 'no limits' for none."""
        parts = []
        if self.latency_us > 0:
            parts.append(f"{self.latency_us:g} µs per request")
            parts.append(f"{self.parallelism} at once" if self.parallelism > 0 else "unbounded parallelism")
        if self.bw_bytes_per_s > 0:
            parts.append(f"{self.bw_bytes_per_s / 1e6:g} MB/s cap")
        if self.iops > 0:
            parts.append(f"{self.iops} IOPS cap")
        return ", ".join(parts) or "no limits"

