"""The drive's rates for swap files at a config's aio settings, measured
with fio before the offload search predicts anything: writes alone, reads
alone, then both at once (what a pipelined swapper asks of the drive). Each
direction runs for `RUNTIME_S` after `RAMP_S` (time-based, so a throttled
drive's first burst is left out), in the trial's cgroup (a test bed's caps
apply), in the search's own directory on the drive."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import IotuneError
from ..model.aio import AioSettings
from ..model.offload_time import DriveRates
from ..model.sweep import SweepPoint
from .executor import Target, TrialFailed
from .fio_executor import FioExecutor

RUNTIME_S = 2.0             # as a sweep's fio trial (sweep.target.BUILTIN_RUNTIME_S)
RAMP_S = 0.5
FILE_BYTES = 64 << 20
FILES = 4


def aio_point(cfg: dict[str, Any]) -> SweepPoint:
    """The aio settings a DeepSpeed config runs with, as a sweep point."""
    block = cfg.get("aio")
    aio = AioSettings.from_ds_json(block if isinstance(block, dict) else {})
    return SweepPoint(block_size=aio.block_size, queue_depth=aio.queue_depth,
                      intra_op_parallelism=aio.intra_op_parallelism, single_submit=aio.single_submit,
                      overlap_events=aio.overlap_events)


def measure_drive_rates(point: SweepPoint, target: Target) -> DriveRates:
    """Read and write rates alone and at once; IotuneError naming fio's failure."""
    where = replace(target, file_bytes=max(FILE_BYTES, point.block_size * point.intra_op_parallelism),
                    files=FILES, runtime_s=RUNTIME_S, ramp_s=RAMP_S)
    try:
        alone, _ = FioExecutor().run(point, where)
        together, _ = FioExecutor(concurrent=True).run(point, where)
    except TrialFailed as e:
        raise IotuneError(f"could not measure the drive's rates with fio at {target.directory}: {e}") from None
    rates = (alone.read_bytes_per_s, alone.write_bytes_per_s, together.read_bytes_per_s,
             together.write_bytes_per_s)
    if min(rates) <= 0:
        raise IotuneError(f"fio measured no throughput at {target.directory} (read/write alone and at once: "
                          f"{', '.join(f'{r:.0f}' for r in rates)} B/s)")
    return DriveRates(*rates)
