"""`iotune sweep` as the CLI runs it: profile plus overrides, the target
(the user's directory, or a built-in emulated drive with known limits, torn
down afterwards), then the sweep itself."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..model.sweep_result import LayoutSweep, Progress, SweepOutcome
from ..blockdev.identity import drive_identity
from ..errors import UsageError
from ..model.drive import DriveLimits
from .executor import Target
from .pipeline import SweepRequest, run_sweep
from .space import Profile, load_profile

# The built-in drive: 200 MB/s and 800 IOPS caps, 4 ms per request with at most
# 8 served at once. Block size matters (IOPS cap), and so does queue depth for
# small blocks (latency): sensible configs reach 200 MB/s, bad ones a fraction.
BUILTIN_LIMITS = DriveLimits(bw_bytes_per_s=200_000_000, iops=800, latency_us=4000.0, parallelism=8)
BUILTIN_SIZE = 1 << 30
BUILTIN_RUNTIME_S = 2.0     # used when the profile sets none
BUILTIN_RAMP_S = 0.5


@dataclass(frozen=True)
class SpaceOverrides:
    """Search-space values given on the command line (None: the profile's)."""

    block_size: tuple[int, ...] | None = None
    queue_depth: tuple[int, ...] | None = None
    intra_op_parallelism: tuple[int, ...] | None = None
    single_submit: tuple[bool, ...] | None = None
    overlap_events: tuple[bool, ...] | None = None
    engine: tuple[str, ...] | None = None

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


@dataclass(frozen=True)
class SweepArgs:
    target_dir: Path | None
    profile: str = "default"
    executor: str = "fio"
    overrides: SpaceOverrides = SpaceOverrides()
    grid: bool = False
    repeats: int | None = None
    file_bytes: int | None = None
    confirm_top: int | None = None
    out: Path | None = None
    fresh: bool = False


def build_profile(args: SweepArgs) -> Profile:
    prof = load_profile(args.profile)
    space = replace(prof.space, **args.overrides.given())
    run = prof.run
    if args.grid:
        run = replace(run, search="grid")
    for key in ("repeats", "file_bytes", "confirm_top"):
        value = getattr(args, key)
        if value is not None:
            run = replace(run, **{key: value})
    if run.file_bytes % 4096:
        raise UsageError("--file-bytes must be a multiple of 4096 (O_DIRECT)")
    if args.executor == "aio" and space.engine != ("libaio",):
        space = replace(space, engine=("libaio",))     # DeepSpeed's aio is libaio only
    return replace(prof, space=space, run=run)


@contextlib.contextmanager
def sweep_target(args: SweepArgs, prof: Profile, say: Callable[[str], None]) -> Iterator[tuple[Target, float | None]]:
    """(target, known ceiling in bytes/s or None)."""
    if args.target_dir is not None:
        yield Target(args.target_dir, prof.run.file_bytes, prof.run.files, None, prof.run.runtime_s,
                     prof.run.ramp_s), None
        return
    from ..volumes.emulated import emulated_drive

    limits = BUILTIN_LIMITS
    with emulated_drive(None, BUILTIN_SIZE, limits, fstype="ext4") as drive:
        say(f"sweep: built-in emulated drive {drive.device.path}: {limits.describe()}, ext4 at {drive.path}")
        # time-based trials: blkio throttling lets a burst through at the start of each
        # direction, which ramp time leaves out, so trials measure the steady rate
        runtime, ramp = prof.run.runtime_s or BUILTIN_RUNTIME_S, prof.run.ramp_s or BUILTIN_RAMP_S
        yield (Target(Path(drive.path), prof.run.file_bytes, prof.run.files, drive.cgroup, runtime, ramp),
               drive.limits.ceiling_bytes_per_s(max(prof.space.block_size), 1 << 30))


def drive_of(args: SweepArgs) -> dict[str, object]:
    """The identity of the drive the sweep runs on: the filesystem and
    device(s) holding --path (not the path: the same drive mounted elsewhere
    is the same drive), or the built-in drive's limits."""
    if args.target_dir is None:
        return {"emulated": BUILTIN_LIMITS.to_json()}
    if not args.target_dir.is_dir():
        return {"path": str(args.target_dir)}      # refused by the pipeline, with its reason
    return drive_identity(str(args.target_dir))


def default_out(profile: str, executor: str, drive: dict[str, object]) -> Path:
    """iotune-sweeps/<profile>-<executor>-<drive hash>: each drive resumes its own journal."""
    digest = hashlib.sha1(json.dumps(drive, sort_keys=True).encode()).hexdigest()[:8]
    return Path("iotune-sweeps") / f"{profile}-{executor}-{digest}"


def run_sweep_command(args: SweepArgs, say: Callable[[str], None],
                      on_trial: Callable[[Progress], None] | None = None) -> tuple[SweepOutcome, Target]:
    prof = build_profile(args)
    drive = drive_of(args)
    out = args.out or default_out(prof.name, args.executor, drive)
    with sweep_target(args, prof, say) as (target, ceiling):
        req = SweepRequest(profile=prof, executor=args.executor, out_dir=out, fresh=args.fresh,
                           ceiling_bytes_per_s=ceiling, drive=drive)
        return run_sweep(req, target, on_trial, say), target


def run_layouts_command(args: SweepArgs, drives: int, cap_bytes_per_s: int, say: Callable[[str], None],
                        on_trial: Callable[[Progress], None] | None = None) -> LayoutSweep:
    """`iotune sweep --layouts N`: RAID0 over 1..N capped scratch drives."""
    from .layouts import effects, quick_profile, sweep_layouts

    prof = quick_profile(build_profile(args))
    out = args.out or Path("iotune-sweeps") / f"{prof.name}-{args.executor}-layouts"
    results = sweep_layouts(prof, args.executor, drives, cap_bytes_per_s, out, ("noatime", "nodatacow"),
                            args.fresh, say, on_trial)
    return LayoutSweep(tuple(results), effects(results))
