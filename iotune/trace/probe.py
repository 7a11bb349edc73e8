"""Loading probes/blockio.c with bcc and reading its maps into model records."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blockdev.devices import BlockDevice, kdev_split
from ..errors import ProbeError
from ..model.run import OPS, DirectionStats
from .kernel import import_bcc, require_headers, require_privileges

DROP_NAMES = ("sizes", "start", "timeline", "other")   # DROP_* in blockio.h


def probes_dir() -> Path:
    env = os.environ.get("IOTUNE_PROBES_DIR")
    d = Path(env) if env else Path(__file__).resolve().parents[2] / "probes"
    if not (d / "blockio.c").exists():
        raise ProbeError(f"probe sources not found in {d}: set IOTUNE_PROBES_DIR to iotune's probes/ directory")
    return d


@dataclass(frozen=True)
class ProbeConfig:
    devices: tuple[BlockDevice, ...] = ()   # empty: every device
    interval_ns: int = 1_000_000_000
    t0_ns: int = 0                          # CLOCK_MONOTONIC origin of the timeline

    def cflags(self, probes: Path) -> list[str]:
        flags = [f"-I{probes}", f"-DT0_NS={self.t0_ns}ULL", f"-DBUCKET_NS={self.interval_ns}ULL"]
        if self.devices:
            flags.append("-DFILTER_DEVS")
        return flags


@dataclass
class DeviceAccumulator:
    """Per-(kdev, op) data assembled from the maps."""

    directions: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    def slot(self, kdev: int, op: int) -> dict[str, Any]:
        return self.directions.setdefault(
            (kdev, op), {"sizes": {}, "size_log2": {}, "lat_slots": {}, "depth": {}, "totals": None}
        )


class BlockProbe:
    """The compiled and attached block-I/O probe. Use as a context manager;
    leaving it detaches everything."""

    def __init__(self, config: ProbeConfig) -> None:
        require_privileges()
        require_headers()
        bcc = import_bcc()
        src = probes_dir()
        self.config = config
        try:
            self.bpf = bcc.BPF(src_file=str(src / "blockio.c").encode(), cflags=config.cflags(src))
        except Exception as e:   # bcc raises bare Exception on compile/attach failure
            raise ProbeError(
                f"bcc could not compile or attach probes/blockio.c ({e}); "
                f"run `iotune doctor` to see which prerequisite is missing"
            ) from None
        if config.devices:
            filt = self.bpf[b"dev_filter"]
            for dev in config.devices:
                filt[filt.Key(dev.kdev)] = filt.Leaf(1)
        self._timeline: dict[tuple[int, int, int], list[int]] = {}

    def __enter__(self) -> BlockProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        bpf = getattr(self, "bpf", None)
        if bpf is not None:
            bpf.cleanup()
            self.bpf = None

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
                acc = self._timeline.setdefault((k.dev, k.op, k.bucket), [0, 0])
                acc[0] += v.requests
                acc[1] += v.bytes
                done.append(k)
        for k in done:
            del table[k]

    def live_totals(self) -> tuple[int, int, int, int]:
        """(read requests, read bytes, write requests, write bytes) so far."""
        rr = rb = wr = wb = 0
        for k, v in self.bpf[b"totals"].items():
            if k.op == 0:
                rr, rb = rr + v.requests, rb + v.bytes
            elif k.op == 1:
                wr, wb = wr + v.requests, wb + v.bytes
        return rr, rb, wr, wb

    def drops(self) -> dict[str, int]:
        return {DROP_NAMES[k.value]: v.value for k, v in self.bpf[b"drops"].items()}

    def timeline(self) -> Iterable[tuple[int, str, int, int, int]]:
        """(kdev, op name, bucket, requests, bytes), after a final drain."""
        for (kdev, op, bucket), (req, nbytes) in sorted(self._timeline.items(), key=lambda x: x[0][2]):
            yield kdev, OPS[op], bucket, req, nbytes

    def collect(self) -> dict[int, dict[str, DirectionStats]]:
        """Everything aggregated so far: kdev -> op name -> DirectionStats."""
        self.drain_timeline(final=True)
        acc = DeviceAccumulator()
        for k, v in self.bpf[b"sizes"].items():
            acc.slot(k.dev, k.op)["sizes"][int(k.size_bytes)] = int(v.value)
        for name in ("size_log2", "lat_slots", "depth_hist"):
            key = "depth" if name == "depth_hist" else name
            for k, v in self.bpf[name.encode()].items():
                acc.slot(k.dev, k.op)[key][int(k.slot)] = int(v.value)
        for k, v in self.bpf[b"totals"].items():
            acc.slot(k.dev, k.op)["totals"] = v
        out: dict[int, dict[str, DirectionStats]] = {}
        for (kdev, op), d in acc.directions.items():
            t = d.pop("totals")
            counts = {f: int(getattr(t, f)) for f in
                      ("requests", "bytes", "sequential", "meta", "completed", "lat_sum_ns", "errors")} if t else {}
            out.setdefault(kdev, {})[OPS[op]] = DirectionStats(op=OPS[op], **counts, **d)
        return out


