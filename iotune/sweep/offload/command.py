"""`iotune sweep offload` as the CLI runs it: which job the trials run
(the user's command, or a built-in model the user names on purpose; never a
built-in model standing in for a user's config), the drive (the shared
target handling of the aio sweep: --path or a test bed), the journal (the
sweep journal, whose identity is the drive, the command, the config's hash
and iotune's version), the host's memory, then the search."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ... import __version__
from ...dsconfig import read_ds_config
from ...errors import UsageError
from ...host.memory import can_lock_unlimited, memlock_bytes, ram_bytes
from ...model.host_memory import HostContext
from ...model.journal import SweepEnv
from ...model.offload import DTYPE_BYTES, OffloadKnobs
from ...model.offload_result import OffloadOutcome
from ...workloads.presets import get_preset
from ...workloads.strategies import WorkloadSpec, ds_config as builtin_config
from ..config import OFFLOAD_SECTIONS
from ..journal import open_journal
from ..target import check_target, default_out, drive_of, sweep_target
from .runner import BuiltinRunner, CommandRunner, Runner, TrialPlan
from .search import OffloadSearch, search_offload
from .what_if import parse_what_if
from .space import Budget, parse_fixes
from ..space import RunSettings
from ..user_job import parse_user_job, refuse_other_models

DEFAULT_MODEL = "small"


@dataclass(frozen=True)
class OffloadArgs:
    """`iotune sweep offload`'s options, parsed."""

    target_dir: Path | None = None
    bed: str | None = None
    model: str | None = None                 # a built-in preset, named on purpose (None: not named)
    seq_len: int | None = None               # the built-in model's tokens per sample
    ds_config: Path | None = None
    steps_cmd: str | None = None
    fixes: tuple[str, ...] = ()
    max_host_memory: int | None = None
    max_trials: int = 12
    max_pairs: int = 6
    steps: int | None = None
    steps_timeout_s: float | None = None
    out: Path | None = None
    fresh: bool = False
    what_if: str | None = None
    budget_s: float | None = None            # --budget (None: the default, from the reference trial's time)


def runner_for(args: OffloadArgs, plan: TrialPlan) -> tuple[Runner, dict[str, Any], dict[str, Any]]:
    """(the runner, the base config, the job's identity for the journal)."""
    if args.steps_cmd:
        job = parse_user_job(args.steps_cmd, args.ds_config, plan.steps, plan.timeout_s, need_nvme=False)
        return CommandRunner(job), job.config, job.identity()
    model = args.model or DEFAULT_MODEL
    get_preset(model)                        # an unknown preset is refused before anything is built
    runner = BuiltinRunner(model, args.seq_len)
    cfg = read_ds_config(args.ds_config) if args.ds_config else None
    return runner, cfg or {}, {"model": model, "seq_len": runner.seq_len, "steps": plan.steps}


def mem_available() -> int | None:
    return ram_bytes("MemAvailable")


def host_budget(max_host_memory: int | None) -> Budget:
    """What one rank may use at its peak: --max-host-memory, else MemAvailable;
    ulimit -l unless this process may lock without limit (root, CAP_IPC_LOCK).
    MemAvailable is read again before every trial either way."""
    locked = None if can_lock_unlimited() else memlock_bytes()
    if max_host_memory is not None:
        return Budget(max_host_memory, locked, "--max-host-memory", mem_available)
    return Budget(mem_available(), locked, "MemAvailable", mem_available)


def host_context(runner: Runner, cfg: dict[str, Any]) -> HostContext:
    """The machine's part of the host-memory model: DeepSpeed's accelerator,
    a process's baseline and what deepspeed.initialize adds to it (measured
    once; the search replaces the baseline by the job's own, measured in its
    shape probe), and the built-in model's activations."""
    from ...workloads.baseline import measure_baseline

    base = measure_baseline()
    activations = 0
    if isinstance(runner, BuiltinRunner):
        knobs = OffloadKnobs.from_ds_config(cfg)
        micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
        activations = get_preset(runner.size).activation_bytes(micro, runner.seq_len, DTYPE_BYTES.get(knobs.dtype, 4))
    return HostContext(base.accelerator, base.baseline_bytes, activations, engine_bytes=base.engine_bytes)


def plan_of(args: OffloadArgs) -> TrialPlan:
    run = RunSettings()
    steps = args.steps or TrialPlan().steps
    if steps < 3:
        raise UsageError(f"--steps {steps}: a trial needs at least 3 optimizer steps (the first creates Adam's "
                         f"moments and is left out; two steady ones must agree)")
    return TrialPlan(steps=steps, timeout_s=args.steps_timeout_s or run.steps_timeout_s)


def run_offload_command(args: OffloadArgs, say: Callable[[str], None]) -> OffloadOutcome:
    refuse_other_models(args.ds_config, args.steps_cmd, args.model, args.seq_len)
    plan = plan_of(args)
    fixes = parse_fixes(list(args.fixes))
    what_if = parse_what_if(args.what_if) if args.what_if else None
    runner, given, identity = runner_for(args, plan)
    if args.target_dir is not None:
        check_target(args.target_dir)
    drive = drive_of(args)
    with sweep_target(args, RunSettings(), say) as (target, _):
        base = given or builtin_config(WorkloadSpec(strategy="nvme-opt", size=args.model or DEFAULT_MODEL,
                                                    nvme_path=str(target.directory), seq_len=args.seq_len))
        if not isinstance(base.get("zero_optimization"), dict) or base["zero_optimization"].get("stage") != 3:
            say("offload: the config is not ZeRO stage 3: the offload knobs iotune searches exist there only")
        config_sha1 = hashlib.sha1(json.dumps(_portable(base), sort_keys=True).encode()).hexdigest()[:12]
        env = SweepEnv(target=str(target.directory), executor="offload", drive=dict(drive), steps_cmd=identity,
                       mode="offload", config_sha1=config_sha1, iotune_version=__version__)
        out = args.out or default_out("offload", drive, job=identity)
        journal = open_journal(out, args.fresh, env, say)
        search = OffloadSearch(base, runner, fixes, host_budget(args.max_host_memory), host_context(runner, base),
                               plan, args.max_trials, max_pairs=args.max_pairs, what_if=what_if)
        check_deepspeed_ops_for_offload()
        return search_offload(replace(search, time_budget_s=args.budget_s), target, journal, say)


def offload_changes(outcome: OffloadOutcome) -> dict[str, Any]:
    """What --apply writes: the recommended knob changes (dotted), and what
    the recommended config needs for them to run, as its trials ran it: an
    offload block moved to NVMe swaps to the recommended config's nvme_path
    (your own, or the drive swept), and NVMe parameters keep its
    stage3_prefetch_bucket_size (0 unless your config sets it). Nothing else
    of the recommended config: the rest is your config as you wrote it."""
    changes = dict(outcome.recommended)
    zero = outcome.config.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    for block in OFFLOAD_SECTIONS:
        b = zero.get(block)
        path = b.get("nvme_path") if isinstance(b, dict) else None
        if changes.get(f"zero_optimization.{block}.device") == "nvme" and path:
            changes[f"zero_optimization.{block}.nvme_path"] = path
    prefetch = zero.get("stage3_prefetch_bucket_size")
    if changes.get("zero_optimization.offload_param.device") == "nvme" and prefetch is not None:
        changes["zero_optimization.stage3_prefetch_bucket_size"] = prefetch
    return changes


def check_deepspeed_ops_for_offload() -> None:
    """Every trial loads DeepSpeed's ops: refuse to start on a left-over build lock."""
    from ...opbuild.oplocks import stale_lock_problem

    problem = stale_lock_problem()
    if problem:
        raise UsageError(problem)


def _portable(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config without its nvme_path (each trial swaps to a directory of its own)."""
    out = json.loads(json.dumps(cfg))
    for block in ("offload_optimizer", "offload_param"):
        b = (out.get("zero_optimization") or {}).get(block)
        if isinstance(b, dict):
            b.pop("nvme_path", None)
    return out

