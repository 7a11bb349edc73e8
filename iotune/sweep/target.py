"""The drive a sweep runs on, for every kind of sweep: the user's directory
(--path) or a built-in test bed (--bed), its identity (which journal it
resumes), the default output directory of every kind of sweep named from
it (default_out), and the checks a target directory must pass."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

from ..blockdev.identity import drive_identity
from ..errors import UsageError
from ..fs.directio import direct_io_problem
from ..host.ledger import temp_dir
from ..model.drive import DriveLimits
from ..volumes.beds import DEFAULT_BED, bed_spec
from .executor import Target
from .space import RunSettings

# The built-in drive: 200 MB/s and 800 IOPS caps, 4 ms per request with at most
# 8 served at once. Block size matters (IOPS cap), and so does queue depth for
# small blocks (latency): sensible configs reach 200 MB/s, bad ones a fraction.
# It is the test bed `builtin` (iotune.volumes.beds); `--bed NAME` picks another.
BUILTIN_BED = DEFAULT_BED
BUILTIN_LIMITS: DriveLimits = bed_spec(BUILTIN_BED).member
BUILTIN_SIZE = bed_spec(BUILTIN_BED).size_bytes
BUILTIN_RUNTIME_S = 2.0     # used when the profile sets none
BUILTIN_RAMP_S = 0.5
SWEEPS_DIR = Path("iotune-sweeps")      # where every sweep's default output directory is


class OnDrive(Protocol):
    """What names the drive a sweep runs on: --path, or a test bed (--bed)."""

    @property
    def target_dir(self) -> Path | None: ...

    @property
    def bed(self) -> str | None: ...


@contextlib.contextmanager
def sweep_target(args: OnDrive, run: RunSettings,
                 say: Callable[[str], None]) -> Iterator[tuple[Target, float | None]]:
    """(target, known ceiling in bytes/s or None)."""
    if args.target_dir is not None:
        with contextlib.ExitStack() as stack:
            # the trials' files in a recorded directory of their own: nothing of a killed sweep stays in
            # the user's directory (a path that is not a directory, or where nothing can be created, is
            # refused by the pipeline's check, with why)
            scratch = None
            if args.target_dir.is_dir():
                with contextlib.suppress(OSError):
                    scratch = temp_dir(stack, ".iotune-sweep-", args.target_dir)
            yield Target(args.target_dir, run.file_bytes, run.files, None, run.runtime_s, run.ramp_s,
                         scratch=scratch), None
        return
    from ..volumes.beds import bed_trouble, running_bed

    with running_bed(args.bed or BUILTIN_BED) as bed:
        what = "built-in emulated drive" if bed.spec.name == BUILTIN_BED else f"test bed {bed.spec.name}"
        devices = ", ".join(d.path for d in bed.devices)
        say(f"sweep: {what} {devices}: {bed.spec.describe()}, at {bed.path}")
        # time-based trials: blkio throttling lets a burst through at the start of each
        # direction, which ramp time leaves out, so trials measure the steady rate
        runtime, ramp = run.runtime_s or BUILTIN_RUNTIME_S, run.ramp_s or BUILTIN_RAMP_S
        yield (Target(bed.path, run.file_bytes, run.files, bed.cgroup, runtime, ramp,
                      trouble=lambda: bed_trouble(bed)), bed.ceiling_bytes_per_s)


def drive_of(args: OnDrive) -> dict[str, object]:
    """The identity of the drive the sweep runs on: the filesystem and
    device(s) holding --path (not the path: the same drive mounted elsewhere
    is the same drive), or the test bed's limits."""
    if args.target_dir is None:
        if args.bed in (None, BUILTIN_BED):
            return {"emulated": BUILTIN_LIMITS.to_json()}
        spec = bed_spec(args.bed)
        return {"bed": spec.name, "emulated": spec.member.to_json(), "drives": spec.drives}
    if not args.target_dir.is_dir():
        return {"path": str(args.target_dir)}      # refused by the pipeline, with its reason
    return drive_identity(str(args.target_dir))


def default_out(kind: str, drive: Mapping[str, object] | None, *parts: str, job: object = None) -> Path:
    """The default output directory of every kind of sweep, one per drive:
    SWEEPS_DIR/<kind>-<parts>-<hash>, the hash of the drive's identity (with
    the job's, where given: another job on the same drive journals apart).
    `kind` is the mode (offload, checkpoint, fleet) or the aio sweep's
    profile. `drive` None: no drive of the user's to name it by (--layouts'
    scratch drives are iotune's own, named inside it; a fleet's run is
    named by its time, in `parts`), and no hash is added."""
    name = "-".join((kind, *parts))
    if drive is None:
        return SWEEPS_DIR / name
    what = dict(drive) if job is None else [dict(drive), job]
    digest = hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return SWEEPS_DIR / f"{name}-{digest}"


def check_target(directory: Path) -> None:
    if not directory.is_dir():
        raise UsageError(f"--path {directory} is not a directory: create it on the drive to tune")
    problem = direct_io_problem(str(directory))
    if problem:
        raise UsageError(f"--path {directory}: {problem}; DeepSpeed swaps with O_DIRECT, so sweep a "
                         f"directory on ext4, xfs or btrfs on the drive you will use")
