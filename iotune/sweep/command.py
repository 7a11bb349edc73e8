"""`iotune sweep` as the CLI runs it: profile plus overrides, the target
(the user's directory, or a built-in emulated drive with known limits, torn
down afterwards), then the sweep itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..model.sweep_result import LayoutSweep, Progress, SweepOutcome
from ..errors import UsageError
from ..model.drive import DriveLimits
from .cmd_executor import UserJob, parse_user_job
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
    omp_threads: tuple[int, ...] | None = None

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
    steps: int | None = None                 # training steps per confirmation trial
    steps_timeout_s: float | None = None     # wall-clock limit per training-step trial
    steps_cmd: str | None = None             # the user's training command, with {config}
    ds_config: Path | None = None            # the user's DeepSpeed config (with steps_cmd)


def build_profile(args: SweepArgs) -> Profile:
    prof = load_profile(args.profile)
    space = replace(prof.space, **args.overrides.given())
    run = prof.run
    if args.grid:
        run = replace(run, search="grid")
    for key in ("repeats", "file_bytes", "confirm_top", "steps", "steps_timeout_s"):
        value = getattr(args, key)
        if value is not None:
            run = replace(run, **{key: value})
    if run.file_bytes % 4096:
        raise UsageError("--file-bytes must be a multiple of 4096 (O_DIRECT)")
    if args.executor == "aio" and space.engine != ("libaio",):
        if args.overrides.engine:
            raise UsageError(f"--engines {','.join(space.engine)}: the aio executor measures DeepSpeed's own "
                             f"engine, which is libaio only; drop --engines, or use --executor fio")
        space = replace(space, engine=("libaio",))     # DeepSpeed's aio is libaio only
    prof = replace(prof, space=space, run=run)
    check_dimensions(prof, args)
    return prof


def check_dimensions(prof: Profile, args: SweepArgs) -> None:
    """Refuse what this sweep could not vary or run, rather than ignore it."""
    if args.ds_config is not None and not args.steps_cmd:
        raise UsageError("--ds-config is the DeepSpeed config of --steps-cmd's job: give --steps-cmd too "
                         "(to write a recommendation into a config, use --apply)")
    needs_steps = [what for what, given in (
        ("--steps-cmd", bool(args.steps_cmd)),
        ("CPU-optimizer threads (--omp-threads, or omp_threads in the profile)",
         any(v > 0 for v in prof.space.omp_threads))) if given]
    if needs_steps and prof.run.confirm_top <= 0:
        raise UsageError(f"{needs_steps[0]} is measured on training steps, and this sweep runs none "
                         f"(--confirm 0 / confirm_top = 0 in profile {prof.name}): give --confirm 1 or more")


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


def run_sweep_command(args: SweepArgs, say: Callable[[str], None],
                      on_trial: Callable[[Progress], None] | None = None) -> tuple[SweepOutcome, Target]:
    prof = build_profile(args)
    job = user_job(args, prof)
    out = args.out or Path("iotune-sweeps") / f"{prof.name}-{args.executor}{'-cmd' if job else ''}"
    with sweep_target(args, prof, say) as (target, ceiling):
        drive: dict[str, object] = ({"path": str(args.target_dir)} if args.target_dir
                                    else {"emulated": BUILTIN_LIMITS.to_json()})
        req = SweepRequest(profile=prof, executor=args.executor, out_dir=out, fresh=args.fresh,
                           ceiling_bytes_per_s=ceiling, drive=drive, user_job=job)
        return run_sweep(req, target, on_trial, say), target


def user_job(args: SweepArgs, prof: Profile) -> UserJob | None:
    """--steps-cmd/--ds-config, checked before anything runs (None: the built-in workload)."""
    if not args.steps_cmd:
        return None
    return parse_user_job(args.steps_cmd, args.ds_config, prof.run.steps, prof.run.steps_timeout_s)


def run_layouts_command(args: SweepArgs, drives: int, cap_bytes_per_s: int, say: Callable[[str], None],
                        on_trial: Callable[[Progress], None] | None = None) -> LayoutSweep:
    """`iotune sweep --layouts N`: RAID0 over 1..N capped scratch drives."""
    from .layouts import effects, quick_profile, sweep_layouts

    prof = build_profile(args)
    steps_only = [what for what, given in (("--steps-cmd", bool(args.steps_cmd)),
                                           ("--omp-threads", any(v > 0 for v in prof.space.omp_threads)))
                  if given]
    if steps_only:
        raise UsageError(f"{steps_only[0]} is measured on training steps, and --layouts runs none (it sweeps "
                         f"scratch drives with the aio search only): use one or the other")
    prof = quick_profile(prof)
    out = args.out or Path("iotune-sweeps") / f"{prof.name}-{args.executor}-layouts"
    results = sweep_layouts(prof, args.executor, drives, cap_bytes_per_s, out, ("noatime", "nodatacow"),
                            args.fresh, say, on_trial)
    return LayoutSweep(tuple(results), effects(results))
