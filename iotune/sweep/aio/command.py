"""`iotune sweep` as the CLI runs it: profile plus overrides, the target
(the user's directory, or a built-in emulated drive with known limits, torn
down afterwards), then the sweep itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ...model.sweep_result import LayoutSweep, Progress, SweepOutcome
from ...errors import UsageError
from ..user_job import UserJob, parse_user_job
from ..executor import Target
from .pipeline import SweepRequest, run_sweep
from ..target import default_out, drive_of, sweep_target
from ..bounds import BOUNDS
from ..sequential import SequentialRule
from ..space import Profile, load_profile

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
    bed: str | None = None          # a named test bed (volumes.beds) when no target_dir; None: builtin
    steps: int | None = None                 # training steps per confirmation trial
    steps_timeout_s: float | None = None     # wall-clock limit per training-step trial
    steps_cmd: str | None = None             # the user's training command, with {config}
    ds_config: Path | None = None            # the user's DeepSpeed config (with steps_cmd)
    model: str | None = None                 # a built-in model for the steps, named on purpose (None: tiny)
    replay_pairs: int | None = None          # replay pairs per candidate before real steps (0: no replay)
    budget_s: float | None = None            # --budget: the most the sweep may take (None: the default)


RUN_FLAGS = ("repeats", "file_bytes", "confirm_top", "steps", "steps_timeout_s", "replay_pairs")   # SweepArgs fields = RunSettings keys


def build_profile(args: SweepArgs) -> Profile:
    prof = load_profile(args.profile)
    given = args.overrides.given()
    run_given = {key: getattr(args, key) for key in RUN_FLAGS if getattr(args, key) is not None}
    check_overrides(given, run_given)
    space = replace(prof.space, **given)
    run = replace(prof.run, **run_given)
    if args.grid:
        run = replace(run, search="grid")
    if args.executor == "aio" and space.engine != ("libaio",):
        if args.overrides.engine:
            raise UsageError(f"--engines {','.join(space.engine)}: the aio executor measures DeepSpeed's own "
                             f"engine, which is libaio only; drop --engines, or use --executor fio")
        space = replace(space, engine=("libaio",))     # DeepSpeed's aio is libaio only
    prof = replace(prof, space=space, run=run)
    check_dimensions(prof, args)
    return prof


def check_overrides(space: dict[str, Any], run: dict[str, Any]) -> None:
    """The command line's values against the bounds a profile's meet (the
    CLI's parameter types check them already; SweepArgs built otherwise too)."""
    for key, values in [*space.items(), *((k, (v,)) for k, v in run.items())]:
        bound = BOUNDS[key]
        for value in values:
            try:
                bound.check(value)
            except ValueError as e:
                raise UsageError(f"{bound.flag} {value}: {e}") from None


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
    step_settings = [flag for flag, value in (("--steps", args.steps), ("--steps-timeout", args.steps_timeout_s),
                                              ("--replay-pairs", args.replay_pairs), ("--budget", args.budget_s))
                     if value is not None]
    if step_settings and prof.run.confirm_top <= 0:
        raise UsageError(f"{step_settings[0]} sets the training-step trials, and this sweep runs none "
                         f"(--confirm 0 / confirm_top = 0 in profile {prof.name}): give --confirm 1 or more, or "
                         f"drop {step_settings[0]}")
    check_replay_pairs(prof)


def check_replay_pairs(prof: Profile) -> None:
    """1 or 2 replay pairs could never decide (the rule first looks at 3): refused, not run in vain."""
    pairs, first = prof.run.replay_pairs, SequentialRule().first_look
    if 0 < pairs < first and prof.run.confirm_top > 0:
        raise UsageError(f"--replay-pairs {pairs} (replay_pairs in profile {prof.name}): the confirmation rule decides "
                         f"from {first} pairs, so fewer never rank a candidate on the replay: give {first} or more, "
                         f"or 0 to run every candidate on real steps")


def run_sweep_command(args: SweepArgs, say: Callable[[str], None],
                      on_trial: Callable[[Progress], None] | None = None) -> tuple[SweepOutcome, Target]:
    if args.bed is not None and args.target_dir is not None:
        raise UsageError("--bed and --path exclude each other: --bed sweeps a built-in test bed, --path "
                         "your own drive; give one")
    prof = build_profile(args)
    job = user_job(args, prof)
    drive = drive_of(args)
    model = args.model or "tiny"
    out = args.out or default_out(prof.name, drive, args.executor + ("-cmd" if job else "" if model == "tiny" else
                                                                     f"-{model}"))
    with sweep_target(args, prof.run, say) as (target, ceiling):
        req = SweepRequest(profile=prof, executor=args.executor, out_dir=out, fresh=args.fresh,
                           ceiling_bytes_per_s=ceiling, drive=drive, user_job=job, model=model, budget_s=args.budget_s)
        return run_sweep(req, target, on_trial, say), target


def user_job(args: SweepArgs, prof: Profile) -> UserJob | None:
    """--steps-cmd/--ds-config, checked before anything runs (None: the built-in workload)."""
    if args.model is not None:
        from ...workloads.presets import get_preset

        if args.steps_cmd:
            raise UsageError("--model names a built-in model, and --steps-cmd runs your own: give one of them")
        get_preset(args.model)
    if not args.steps_cmd:
        return None
    return parse_user_job(args.steps_cmd, args.ds_config, prof.run.steps, prof.run.steps_timeout_s)


def refuse_steps(args: SweepArgs, prof: Profile, runs_none: str) -> None:
    """Options of the training-step trials, refused for a sweep that runs none."""
    given = [what for what, value in (
        ("--steps-cmd", bool(args.steps_cmd)), ("--ds-config", args.ds_config is not None),
        ("--omp-threads", any(v > 0 for v in prof.space.omp_threads)), ("--confirm", bool(args.confirm_top)),
        ("--steps", args.steps is not None), ("--steps-timeout", args.steps_timeout_s is not None),
        ("--budget", args.budget_s is not None)) if value]
    if given:
        raise UsageError(f"{given[0]} is for training steps, and {runs_none}: drop {given[0]}")


def run_layouts_command(args: SweepArgs, drives: int, cap_bytes_per_s: int, say: Callable[[str], None],
                        on_trial: Callable[[Progress], None] | None = None,
                        filesystems: tuple[str, ...] | None = None) -> LayoutSweep:
    """`iotune sweep layouts --drives N`: RAID0 over 1..N capped scratch drives,
    with `filesystems` each in its mount-option variants (default: btrfs,
    noatime,nodatacow)."""
    from .layouts import effects, quick_profile, sweep_layouts

    prof = build_profile(args)
    refuse_steps(args, prof, "--layouts runs none (it sweeps scratch drives with the aio search only)")
    prof = quick_profile(prof)
    out = args.out or default_out(prof.name, None, args.executor, "layouts")
    results = sweep_layouts(prof, args.executor, drives, cap_bytes_per_s, out, ("noatime", "nodatacow"),
                            args.fresh, say, on_trial, filesystems)
    return LayoutSweep(tuple(results), effects(results))


def run_netfs_command(args: SweepArgs, say: Callable[[str], None],
                      on_trial: Callable[[Progress], None] | None = None) -> LayoutSweep:
    """`iotune sweep netfs --path DIR`: the network filesystem's client
    knobs (Lustre, NFS) as variants, the aio search in each, ranked together."""
    from .layouts import effects, quick_profile
    from .netfs import sweep_netfs

    if args.target_dir is None:
        raise UsageError("--netfs sweeps the client knobs of the filesystem holding --path: give --path DIR")
    prof = build_profile(args)
    refuse_steps(args, prof, "--netfs runs none (the aio search in each variant)")
    prof = quick_profile(prof)
    out = args.out or default_out(prof.name, drive_of(args), args.executor, "netfs")
    results = sweep_netfs(prof, args.executor, args.target_dir, out, args.fresh, say, on_trial)
    return LayoutSweep(tuple(results), effects(results))
