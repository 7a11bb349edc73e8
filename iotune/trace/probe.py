"""Loading probes/blockio.c with bcc and reading its maps into model records.

The map layout is in probes/blockio.h. Counters are per CPU and summed here;
per-(device, op) totals are sums over the timeline's buckets, and the log2
size histogram is derived from the exact sizes. The probe reads struct
request itself (raw tracepoints), at offsets taken from the kernel's BTF.
"""

from __future__ import annotations

import struct
import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blockdev.devices import BlockDevice, list_devices
from ..errors import ProbeError
from ..model.histogram import log2_from_sizes
from ..model.run import OPS, DirectionStats
from ..resources import probes_dir
from .btf import kernel_offsets
from .kernel import (VMLINUX_BTF, BpfProgram, import_bcc, require_headers, require_kernel_features,
                     require_privileges, tracefs_events)

# DROP_* in blockio.h, in index order.
DROP_NAMES = ("sizes", "start", "timeline", "other", "no_completion", "devices", "queue")
# Events the kernel did not run a program for (fdinfo recursion_misses: another
# tracing BPF program was running on that CPU). Any device's events, since the
# device filter runs inside the program: an upper bound for the traced devices.
MISSED_NAMES = {"issue": "missed_issue", "complete": "missed_complete", "requeue": "missed_requeue",
                "insert": "missed_insert", "merge": "missed_merge"}
# Devices compared as constants in the program (DEV_0..DEV_7 in blockio.c);
# more go into the `dev_ids` map, looked up after the constants.
CONST_DEVS = 8
NOPS = len(OPS)                 # NOPS in blockio.h
LAT_SLOTS, DEPTH_SLOTS, SIZE_SLOTS = 264, 128, 257   # row sizes in blockio.h
SIZE_UNIT = 4096                # bytes per size_hist slot
DEVICE_HEADROOM = 8             # no filter: index slots for disks that appear while tracing
MAX_DEV_INDEX = 128             # per-CPU rows cost ~26 KB per device index on every CPU
START_SLOTS_MIN, START_SLOTS_MAX = 1024, 65536   # 32 bytes each, shared
SYS_BLOCK = Path("/sys/block")
TIMELINE_FIELDS = ("requests", "bytes", "sequential", "meta")
DONE_FIELDS = ("completed", "lat_sum_ns", "errors", "queued", "queue_sum_ns")


@dataclass(frozen=True)
class ProbeConfig:
    """What the probe is compiled for. Its per-CPU histogram rows take about
    26 KB per device index on every CPU: one index per selected device, or
    without a filter `max_devices` (default: the disks that have a size now,
    plus DEVICE_HEADROOM)."""

    devices: tuple[BlockDevice, ...] = ()   # empty: every device
    interval_ns: int = 1_000_000_000
    t0_ns: int = 0                          # CLOCK_MONOTONIC origin of the timeline
    max_devices: int | None = None          # no filter: devices indexed
    timeline_entries: int | None = None     # timeline map size (MAX_BUCKETS; default in blockio.c)

    def kdevs(self) -> list[int]:
        """Kernel dev_t of each selected device, without repeats: index order."""
        return list(dict.fromkeys(dev.kdev for dev in self.devices))

    def device_slots(self) -> int:
        if self.devices:
            n = len(self.kdevs())
        else:
            n = self.max_devices or sum(1 for d in list_devices() if disk_sectors(d.name)) + DEVICE_HEADROOM
        if n > MAX_DEV_INDEX:
            raise ProbeError(f"the probe traces at most {MAX_DEV_INDEX} devices at once; choose fewer with -d")
        return n

    def start_slots(self) -> int:
        """Start table size: 4x the requests the devices can have in flight."""
        names = [d.name for d in self.devices] or [d.name for d in list_devices()]
        inflight = sum(queue_limit(name) for name in names)
        n = START_SLOTS_MIN
        while n < 4 * inflight and n < START_SLOTS_MAX:
            n *= 2
        return n

    def cflags(self, probes: Path, layout: KernelLayout) -> list[str]:
        flags = [f"-I{probes}", f"-DT0_NS={self.t0_ns}ULL", f"-DBUCKET_NS={self.interval_ns}ULL",
                 f"-DMAX_INFLIGHT={self.start_slots()}", *layout.cflags()]
        if self.timeline_entries is not None:
            flags.append(f"-DMAX_BUCKETS={self.timeline_entries}")
        kdevs = self.kdevs()
        if not kdevs:
            return flags + [f"-DMAX_DEVS={self.device_slots()}"]
        consts = kdevs[:CONST_DEVS]
        flags += [f"-DNDEVS={len(consts)}", f"-DNDEV_SLOTS={self.device_slots()}"]
        flags += [f"-DDEV_{i}={kdev}U" for i, kdev in enumerate(consts)]
        if len(kdevs) > CONST_DEVS:
            flags.append("-DFILTER_MAP")
        return flags


def disk_sectors(name: str) -> int:
    try:
        return int((SYS_BLOCK / name / "size").read_text())
    except (OSError, ValueError):
        return 0


def queue_limit(name: str) -> int:
    """Requests a device can have in flight: nr_requests x hardware queues."""
    q = SYS_BLOCK / name
    try:
        nr = int((q / "queue" / "nr_requests").read_text())
    except (OSError, ValueError):
        nr = 256
    try:
        hw = sum(1 for _ in (q / "mq").iterdir()) or 1
    except OSError:
        hw = 1
    return nr * hw


# ---------------------------------------------------------------- kernel layout (BTF)

# -D name -> (struct, member) whose byte offset it is
LAYOUT_FIELDS = {
    "RQ_Q_OFF": ("request", "q"), "RQ_FLAGS_OFF": ("request", "cmd_flags"),
    "RQ_LEN_OFF": ("request", "__data_len"), "RQ_SECTOR_OFF": ("request", "__sector"),
    "Q_DISK_OFF": ("request_queue", "disk"),
    "DISK_MAJOR_OFF": ("gendisk", "major"), "DISK_MINOR_OFF": ("gendisk", "first_minor"),
}
# -D name -> enumerator whose value it is (REQ_OP_BITS: the first flag bit)
LAYOUT_ENUMS = {
    "KOP_READ": "REQ_OP_READ", "KOP_WRITE": "REQ_OP_WRITE", "KOP_FLUSH": "REQ_OP_FLUSH",
    "KOP_DISCARD": "REQ_OP_DISCARD", "KOP_SECURE_ERASE": "REQ_OP_SECURE_ERASE",
    "KOP_DRV_IN": "REQ_OP_DRV_IN", "KOP_DRV_OUT": "REQ_OP_DRV_OUT",
    "REQ_OP_BITS": "__REQ_FAILFAST_DEV", "REQ_META_BIT": "__REQ_META",
}


@dataclass(frozen=True)
class KernelLayout:
    """Offsets and constants of the running kernel that the probe needs."""

    values: dict[str, int]

    def cflags(self) -> list[str]:
        return [f"-D{k}={v}" for k, v in sorted(self.values.items())]

    @classmethod
    def from_btf(cls, path: Path = VMLINUX_BTF) -> KernelLayout:
        return cls(kernel_offsets(LAYOUT_FIELDS, LAYOUT_ENUMS, "the block probe", "struct request's layout",
                                  "iotune's block probe needs Linux 5.15 or later", path))


def per_cpu_sum(values: Sequence[Any], fields: Sequence[str]) -> list[int]:
    """Per-field sums of a per-CPU value (one struct per possible CPU)."""
    return [sum(int(getattr(v, f)) for v in values) for f in fields]


def row_sums(leaf: Any, nslots: int) -> dict[int, int]:
    """Non-zero slots of a per-CPU histogram row, summed over CPUs."""
    flat = array("Q", bytes(leaf))
    sums = (sum(flat[s::nslots]) for s in range(nslots))
    return {s: n for s, n in enumerate(sums) if n}


@dataclass
class DeviceAccumulator:
    """Per-(kdev, op) data assembled from the maps."""

    directions: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    def slot(self, kdev: int, op: int) -> dict[str, Any]:
        return self.directions.setdefault(
            (kdev, op), {"sizes": {}, "size_log2": {}, "lat_slots": {}, "queue_slots": {}, "depth": {},
                         "counts": {}}
        )

    def add(self, kdev: int, op: int, hist: str, slots: dict[int, int]) -> None:
        h = self.slot(kdev, op)[hist]
        for s, n in slots.items():
            h[s] = h.get(s, 0) + n

    def add_counts(self, kdev: int, op: int, names: Sequence[str], values: Sequence[int]) -> None:
        counts = self.slot(kdev, op)["counts"]
        for f, n in zip(names, values):
            counts[f] = counts.get(f, 0) + n

    def stats(self) -> dict[int, dict[str, DirectionStats]]:
        out: dict[int, dict[str, DirectionStats]] = {}
        for (kdev, op), d in self.directions.items():
            log2 = log2_from_sizes(d["sizes"])
            for slot, n in d.pop("size_log2").items():   # requests whose exact size was not kept
                log2[slot] = log2.get(slot, 0) + n
            counts = d.pop("counts")
            out.setdefault(kdev, {})[OPS[op]] = DirectionStats(op=OPS[op], size_log2=log2, **counts, **d)
        return out


class BlockProbe(BpfProgram):
    """The compiled and attached block-I/O probe. Use as a context manager;
    leaving it detaches everything."""

    def __init__(self, config: ProbeConfig) -> None:
        require_privileges()
        require_headers()
        bcc = import_bcc()
        require_kernel_features(tracefs_events())
        src = probes_dir()
        self.config = config
        cflags = config.cflags(src, KernelLayout.from_btf())
        try:
            self.bpf = bcc.BPF(src_file=str(src / "blockio.c").encode(), cflags=cflags)
        except Exception as e:   # bcc raises bare Exception on compile/attach failure
            raise ProbeError(
                f"bcc could not compile or attach probes/blockio.c ({e}); "
                f"run `iotune doctor` to see which prerequisite is missing"
            ) from None
        kdevs = config.kdevs()
        if len(kdevs) > CONST_DEVS:
            ids = self.bpf[b"dev_ids"]
            for i, kdev in enumerate(kdevs[CONST_DEVS:], start=CONST_DEVS):
                ids[ids.Key(kdev)] = ids.Leaf(i)
        # (kdev, op, bucket) -> [requests, bytes, sequential, meta], drained from the kernel
        self._timeline: dict[tuple[int, int, int], list[int]] = {}

    def current_bucket(self) -> int:
        return max(0, (time.monotonic_ns() - self.config.t0_ns) // self.config.interval_ns)

    def drain_timeline(self, final: bool = False) -> None:
        """Move finished timeline buckets out of the kernel map (keeps it small
        on long runs). A bucket is finished once the clock is two past it."""
        table = self.bpf[b"timeline"]
        limit = None if final else self.current_bucket() - 1
        done = []
        for k, v in table.items():
            if limit is None or k.bucket < limit:
                acc = self._timeline.setdefault((k.dev, k.op, k.bucket), [0] * len(TIMELINE_FIELDS))
                for i, n in enumerate(per_cpu_sum(v, TIMELINE_FIELDS)):
                    acc[i] += n
                done.append(k)
        for k in done:
            del table[k]

    def _totals(self) -> dict[tuple[int, int], list[int]]:
        """(kdev, op) -> [requests, bytes, sequential, meta]: drained buckets
        plus those still in the kernel map."""
        out: dict[tuple[int, int], list[int]] = {}
        live = [(k.dev, k.op, per_cpu_sum(v, TIMELINE_FIELDS)) for k, v in self.bpf[b"timeline"].items()]
        drained = [(kdev, op, acc) for (kdev, op, _), acc in self._timeline.items()]
        for kdev, op, vals in drained + live:
            tot = out.setdefault((kdev, op), [0] * len(TIMELINE_FIELDS))
            for i, n in enumerate(vals):
                tot[i] += n
        return out

    def live_totals(self) -> tuple[int, int, int, int]:
        """(read requests, read bytes, write requests, write bytes) so far."""
        rr = rb = wr = wb = 0
        for (_, op), (req, nbytes, _, _) in self._totals().items():
            if op == 0:
                rr, rb = rr + req, rb + nbytes
            elif op == 1:
                wr, wb = wr + req, wb + nbytes
        return rr, rb, wr, wb

    def drops(self) -> dict[str, int]:
        out = {DROP_NAMES[k.value]: int(v.value) for k, v in self.bpf[b"drops"].items()}
        out.update(self.missed_events())
        return out

    def missed_events(self) -> dict[str, int]:
        """Events the kernel skipped our programs for, from their fdinfo."""
        out = {}
        for name, fn in self.bpf.funcs.items():
            key = next((v for k, v in MISSED_NAMES.items() if k.encode() in name), None)
            try:
                info = Path(f"/proc/self/fdinfo/{fn.fd}").read_text() if key else ""
            except OSError:
                continue
            for line in info.splitlines():
                if line.startswith("recursion_misses:"):
                    out[str(key)] = int(line.split(":", 1)[1])
        return out

    def timeline(self) -> Iterable[tuple[int, str, int, int, int]]:
        """(kdev, op name, bucket, requests, bytes), after a final drain."""
        for (kdev, op, bucket), acc in sorted(self._timeline.items(), key=lambda x: x[0][2]):
            yield kdev, OPS[op], bucket, acc[0], acc[1]

    def device_index(self) -> dict[int, int]:
        """Device index (row // NOPS in the per-CPU arrays) -> kdev."""
        kdevs = self.config.kdevs()
        if kdevs:
            return dict(enumerate(kdevs))
        return {int(v.value): int(k.value) for k, v in self.bpf[b"dev_ids"].items()}

    def collect(self) -> dict[int, dict[str, DirectionStats]]:
        """Everything aggregated so far: kdev -> op name -> DirectionStats."""
        self.drain_timeline(final=True)
        acc = DeviceAccumulator()
        for (kdev, op), vals in self._totals().items():
            acc.add_counts(kdev, op, TIMELINE_FIELDS, vals)
        for k, v in self.bpf[b"sizes"].items():
            acc.add(k.dev, k.op, "sizes", {int(k.size_bytes): sum(v)})
        for name, hist in (("size_log2_overflow", "size_log2"), ("lat_overflow", "lat_slots"),
                           ("queue_overflow", "queue_slots"), ("depth_overflow", "depth")):
            for k, v in self.bpf[name.encode()].items():
                acc.add(k.dev, k.op, hist, {int(k.slot): sum(v)})
        done, lat, queue, depth, size = (self.bpf[n] for n in (b"done", b"lat_hist", b"queue_hist", b"depth_hist",
                                                                b"size_hist"))
        for di, kdev in self.device_index().items():
            for op in range(NOPS):
                row = di * NOPS + op
                counts = per_cpu_sum(done[row], DONE_FIELDS)
                hists = {"lat_slots": row_sums(lat[row], LAT_SLOTS), "queue_slots": row_sums(queue[row], LAT_SLOTS),
                         "depth": row_sums(depth[row], DEPTH_SLOTS),
                         "sizes": {s * SIZE_UNIT: n for s, n in row_sums(size[row], SIZE_SLOTS).items()}}
                if not any(counts) and not any(hists.values()):
                    continue
                acc.add_counts(kdev, op, DONE_FIELDS, counts)
                for name, slots in hists.items():
                    acc.add(kdev, op, name, slots)
        return acc.stats()
