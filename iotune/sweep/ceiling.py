"""A traced device's ceiling, for the verdict's "distance to the device":
from a sweep journal of the same drive when one exists, or from a short fio
probe (`--ceiling`) through the sweep's own fio executor.

The probe writes two swap-like files with O_DIRECT in a temporary directory
on the device's filesystem, then reads them back, at 1 MiB requests and
queue depth 32 (deep enough to saturate what a bandwidth-bound drive can
do), PROBE_RUNTIME_S per direction after PROBE_RAMP_S of ramp: about 9 s in
all. It is one point, not a sweep: a drive that needs more in flight than
that reaches more in `iotune sweep`. A device with no mounted filesystem is
not probed (writing to it raw would destroy its data)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from ..blockdev.devices import BlockDevice, mount_point_of
from ..fs.directio import direct_io_problem
from ..blockdev.identity import device_identities, journal_drive_matches
from ..errors import IotuneError, RecordError
from ..host.ledger import temp_dir
from ..model import units
from ..model.journal import read_journal
from ..model.sweep import SweepPoint, Trial
from ..model.verdict import DeviceCeiling
from .executor import Target
from .fio_executor import FioExecutor
from .target import SWEEPS_DIR

PROBE_POINT = SweepPoint(block_size=1 << 20, queue_depth=32, intra_op_parallelism=1)
PROBE_FILES = 2
PROBE_FILE_BYTES = 64 << 20
PROBE_MIN_FILE_BYTES = 8 << 20
PROBE_RUNTIME_S = 4.0
PROBE_RAMP_S = 0.5
DEVICE_EXECUTORS = ("fio", "aio")        # journal trials that measure the device (not training steps)


def journal_ceiling(dev: BlockDevice, root: Path = SWEEPS_DIR) -> DeviceCeiling | None:
    """The best fio/aio trial of any sweep journal under `root` whose drive is
    `dev` (matched by filesystem UUID or device id), or None."""
    if not root.is_dir():
        return None
    uuid, ids = device_identities(dev)
    best: tuple[Trial, Path, int] | None = None
    for path in sorted(root.glob("*/journal.jsonl")):
        try:
            contents = read_journal(path)
        except RecordError:
            continue
        if contents.env is None or not journal_drive_matches(contents.env.drive, uuid, ids):
            continue
        ok = [t for t in contents.trials if t.status == "ok" and t.executor in DEVICE_EXECUTORS
              and t.measurement is not None and t.measurement.read_bytes_per_s and t.measurement.write_bytes_per_s]
        top = max(ok, key=lambda t: t.measurement.score if t.measurement else 0.0, default=None)
        if top is not None and top.measurement and (best is None or best[0].measurement is None
                                                   or top.measurement.score > best[0].measurement.score):
            best = (top, path.parent, len(ok))
    if best is None or best[0].measurement is None:
        return None
    trial, where, n = best
    m = trial.measurement
    return DeviceCeiling(dev.name, m.score, f"sweep journal {where} (best of {n} {trial.executor} trials)",
                         m.read_bytes_per_s, m.write_bytes_per_s, _lat_us(m.read_lat_p50_us, m.write_lat_p50_us))


def _lat_us(*values: float | None) -> float | None:
    known = [v for v in values if v]
    return sum(known) / len(known) if known else None


def probe_ceiling(dev: BlockDevice, runtime_s: float = PROBE_RUNTIME_S) -> DeviceCeiling:
    """fio on `dev`'s filesystem for about 2 x (runtime_s + ramp) seconds."""
    where = mount_point_of(dev)
    if where is None:
        raise IotuneError(f"--ceiling: {dev.name} has no mounted filesystem, and probing the raw device would "
                          f"overwrite it; mount it, or sweep a directory on it (`iotune sweep --path DIR`)")
    problem = direct_io_problem(where)
    if problem:
        raise IotuneError(f"--ceiling: cannot probe {dev.name} at {where}: {problem}")
    free = shutil.disk_usage(where).free
    file_bytes = min(PROBE_FILE_BYTES, (free // (4 * PROBE_FILES)) // (1 << 20) * (1 << 20))
    if file_bytes < PROBE_MIN_FILE_BYTES:
        raise IotuneError(f"--ceiling: {where} has {units.volume(free)} free; the probe needs "
                          f"{units.volume(4 * PROBE_FILES * PROBE_MIN_FILE_BYTES)}: free some space")
    with contextlib.ExitStack() as stack:       # its files in a recorded directory: a hard kill leaves none
        target = Target(temp_dir(stack, ".iotune-ceiling-", Path(where)), file_bytes, PROBE_FILES, None, runtime_s,
                        PROBE_RAMP_S)
        m, _ = FioExecutor(timeout_s=60 + 4 * runtime_s).run(PROBE_POINT, target)
    p = PROBE_POINT
    source = (f"fio probe (--ceiling) in {where}: {units.size(p.block_size)} requests at queue depth {p.queue_depth}, "
              f"{runtime_s:g} s of writes then {runtime_s:g} s of reads")
    return DeviceCeiling(dev.name, m.score, source, m.read_bytes_per_s, m.write_bytes_per_s,
                         _lat_us(m.read_lat_p50_us, m.write_lat_p50_us))
