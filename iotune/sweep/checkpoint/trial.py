"""One checkpoint trial: a real save_checkpoint and a real load_checkpoint.

- save run: the job trains `save_at` steps, saves (with the candidate's
  writer, directory and writeback limit), and trains on: `measure_steps`
  steps timed (they carry what the save left behind: writeback), and as
  many as the restore compares;
- restore run: a fresh process, on a fresh swap directory, loads that
  checkpoint and trains `restore_steps` steps. The first step's losses
  check the weights (exactly, or within loss_rel_tol), the later steps'
  the optimizer state (within optimizer_rel_tol): see
  iotune.model.checkpoint_sweep.

The built-in workload (iotune.workloads.train) saves and restores itself
(--save-at, --load-checkpoint) and resumes its data at the right batch (its
batches are a function of the seed and the micro-step; its model draws no
random numbers). A user's job is driven by the startup hook
(_iotune_ckpt.py): it saves after the save_at-th step, captures the inputs
of the next forward calls with the random number generators' states at
each, and in the restore run loads the checkpoint before the first forward
and replays those inputs, setting the generators right before each replayed
forward: a job whose data loader starts over, or draws its batches from
torch's global generator, is compared on the batches the uninterrupted run
trained on next, with the same dropout draws. What a job keeps outside
DeepSpeed's checkpoint (its own scheduler, its data order beyond the
replayed batches) is not restored by any candidate: the defaults then fail
the check as well, and the outcome says so.

Everything a trial creates (swap and checkpoint directories, configs,
events) is removed when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...dsconfig import read_ds_config
from ...host.ledger import private_tmp, temp_dir
from ...host.proc import last_line
from ...host.writeback import dirty_limit
from ...model.attribution import Attribution
from ...model.checkpoint import LAUNCHER_VARS, restarts_adam
from ...model.checkpoint_io import CheckpointCall
from ...model.checkpoint_sweep import (OPTIMIZER_LOST, CheckpointCandidate, CheckpointRequest, CheckpointTrial,
                                      RestoreCheck)
from ...model.hook_events import hook_env, read_events, read_losses
from ...resources import inject_dir
from ...workloads.strategies import WorkloadSpec, ds_config
from ..config import REMOVE, aio_block_changes, candidate_config
from ..user_job import PLACEHOLDER, JobRun, run_job
from ..executor import TrialFailed
from .space import launcher_refusal

SWAP_PREFIX = "iotune-swap-"
CKPT_PREFIX = "iotune-ckpt-"


def base_config(request: CheckpointRequest) -> dict[str, Any]:
    """The job's DeepSpeed config before a candidate's settings."""
    if request.steps_cmd:
        return read_ds_config(Path(request.ds_config))
    return ds_config(WorkloadSpec(strategy=request.strategy, size=request.preset, nvme_path=request.swap_dir,
                                  precision=request.precision))


def candidate_changes(candidate: CheckpointCandidate) -> dict[str, Any]:
    """What the candidate decides, in DeepSpeed's dotted keys: its writer
    block (torch.save: none, a writer in the job's config removed) and its
    aio block's swept keys, if it has one of its own. A trial writes these
    into the job's config (sweep.config.candidate_config); --apply writes
    the pick's. The directory and the writeback limit are not config keys."""
    writer = candidate.writer.to_ds_json()
    changes: dict[str, Any] = {"checkpoint.writer": REMOVE if writer is None else writer}
    if candidate.aio is not None:
        changes.update(aio_block_changes(candidate.aio))
    return changes


def accumulation(config: dict[str, Any]) -> int:
    gas = config.get("gradient_accumulation_steps", 1)
    return gas if isinstance(gas, int) and gas > 0 else 1


@dataclass(frozen=True)
class Run:
    """One process tree of a trial, done."""

    job: JobRun
    att: Attribution | None
    losses: tuple[float, ...]          # rank 0's, one per backward call, in order


def _run(request: CheckpointRequest, config: dict[str, Any], work: Path, argv_tail: list[str],
         extra_env: dict[str, str], steps: int) -> Run:
    work.mkdir()
    (work / "ds_config.json").write_text(json.dumps(config, indent=1) + "\n")
    events = work / "events"
    events.mkdir()
    if request.steps_cmd:
        argv = [a.replace(PLACEHOLDER, str(work / "ds_config.json")) for a in request.steps_cmd]
        max_steps: int | None = steps
    else:
        argv = [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config",
                str(work / "ds_config.json"), "--size", request.preset, "--seed", str(request.seed), *argv_tail]
        max_steps = None
    env = private_tmp({**hook_env(dict(os.environ), inject_dir(), events, max_steps), "IOTUNE_LOSSES": "1",
                       **extra_env}, work / "tmp")
    job = run_job(argv, env, request.cgroup or None, request.timeout_s, work, events, steps)
    losses = read_losses(events).get(0, [])
    return Run(job, read_events(events), tuple(v for _, v in losses))


def _cpu_writer_env(request: CheckpointRequest, candidate: CheckpointCandidate) -> dict[str, str]:
    """The built-in workload's fast-writer workaround on the CPU accelerator (see _iotune_ckpt.py)."""
    fast = candidate.writer.kind == "fast"
    return {"IOTUNE_CPU_FAST_WRITER": "1"} if fast and request.accelerator == "cpu" and not request.steps_cmd else {}


def save_run(request: CheckpointRequest, candidate: CheckpointCandidate, config: dict[str, Any], work: Path,
             ckpt: Path) -> Run:
    steps = request.save_at + max(request.measure_steps, request.restore_steps)
    env = _cpu_writer_env(request, candidate)
    if request.steps_cmd:
        env.update(IOTUNE_CKPT_SAVE_AT=str(request.save_at), IOTUNE_CKPT_DIR=str(ckpt),
                   IOTUNE_CKPT_CAPTURE=str(work.parent / "capture"),
                   IOTUNE_CKPT_CAPTURE_COUNT=str(request.restore_steps * accumulation(config)))
        (work.parent / "capture").mkdir(exist_ok=True)
    tail = ["--steps", str(steps), "--save-at", str(request.save_at), "--checkpoint-dir", str(ckpt)]
    with dirty_limit(str(ckpt.parent), candidate.dirty_limit_bytes):
        return _run(request, config, work, tail, env, steps)


def restore_run(request: CheckpointRequest, candidate: CheckpointCandidate, config: dict[str, Any], work: Path,
                ckpt: Path) -> Run:
    env = _cpu_writer_env(request, candidate)
    if request.steps_cmd:
        env.update(IOTUNE_CKPT_LOAD=str(ckpt), IOTUNE_CKPT_REPLAY=str(work.parent / "capture"))
    tail = ["--steps", str(request.save_at + request.restore_steps), "--load-checkpoint", str(ckpt)]
    return _run(request, config, work, tail, env, request.restore_steps)


def check_restore(request: CheckpointRequest, config: dict[str, Any], saved: Run, restored: Run) -> RestoreCheck:
    """The restored run's first steps' losses against the save run's at the
    same steps: the first step's check the weights, the later ones' the
    optimizer state (iotune.model.checkpoint_sweep)."""
    gas = accumulation(config)
    count = request.restore_steps * gas
    want = saved.losses[request.save_at * gas:][:count]
    got = restored.losses[:count]
    load = _call(restored.att, "load")
    loaded, load_s = (load.loaded, load.seconds) if load is not None else (None, None)
    weights = _compare(want, got, 0, gas, request.loss_rel_tol)
    optimizer = _compare(want, got, gas, count - gas, request.optimizer_rel_tol) if weights.equal else Compared()
    reason = _failure(request, load, want, got, count, gas, restored)
    if not reason and weights.equal is False:
        reason = f"{_mismatch(request, want, got, weights, gas)}: the weights were not restored"
    elif not reason and optimizer.equal is False:
        restart = " (Adam restarted)" if restarts_adam(config) else ""
        reason = (f"{OPTIMIZER_LOST}{restart}: {_mismatch(request, want, got, optimizer, gas)}, beyond "
                  f"{request.optimizer_rel_tol:g}")
    diffs = [d for d in (weights.worst, optimizer.worst) if d is not None]
    return RestoreCheck(not reason, tuple(want), tuple(got), max(diffs) if diffs else None, loaded, load_s, reason,
                        weights.equal, optimizer.equal, gas, weights.worst, optimizer.worst)


@dataclass(frozen=True)
class Compared:
    """Losses compared: equal within the tolerance (None: not compared),
    the worst relative difference, the first index beyond the tolerance."""

    equal: bool | None = None
    worst: float | None = None
    first_beyond: int | None = None


def _compare(want: Sequence[float], got: Sequence[float], start: int, count: int, tol: float) -> Compared:
    """want[start:start+count] against got's, when both hold that many."""
    if count < 1 or len(want) < start + count or len(got) < start + count:
        return Compared()
    diffs = [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(got[start:start + count],
                                                                      want[start:start + count])]
    beyond = next((start + i for i, d in enumerate(diffs) if d > tol), None)
    return Compared(beyond is None, max(diffs), beyond)


def _mismatch(request: CheckpointRequest, want: Sequence[float], got: Sequence[float], c: Compared, gas: int) -> str:
    at = c.first_beyond if c.first_beyond is not None else 0
    diff = abs(got[at] - want[at]) / abs(want[at]) if want[at] else abs(got[at] - want[at])
    return (f"loss after the restore {got[at]!r} != {want[at]!r} of the uninterrupted run at step "
            f"{request.save_at + at // gas + 1} (relative difference {diff:.3g})")


def _failure(request: CheckpointRequest, load: CheckpointCall | None, want: Sequence[float], got: Sequence[float],
             count: int, gas: int, restored: Run) -> str:
    """Why the losses cannot all be compared ("" : they can)."""
    if load is not None and load.raised:
        return f"load_checkpoint raised {load.raised}"
    if load is not None and load.loaded is False:
        return "load_checkpoint found no checkpoint to load (no `latest` naming a tag)"
    if len(want) < count:
        return f"the uninterrupted run recorded {len(want)} loss(es) after the save, not {count}"
    if len(got) < count:
        return (f"the restored run failed before its step {len(got) // gas + 1} (exit {restored.job.returncode}): "
                f"{last_line(restored.job.stderr, 'no output on stderr')}")
    return ""


def _call(att: Attribution | None, op: str) -> CheckpointCall | None:
    return next((c for c in (att.checkpoints if att else ()) if c.op == op and c.rank == 0), None)


def step_times(att: Attribution | None) -> dict[int, float]:
    """step -> seconds from its first phase to the end of its optimizer phase,
    the slowest rank's (a save between steps is left out)."""
    out: dict[int, float] = {}
    if att is None:
        return out
    for rank in att.ranks:
        start: dict[int, int] = {}
        end: dict[int, int] = {}
        for p in (p for p in att.phases if p.rank == rank and p.phase not in ("checkpoint", "restore")):
            start[p.step] = min(start.get(p.step, p.t0_ns), p.t0_ns)
            if p.phase == "optimizer":
                end[p.step] = max(end.get(p.step, p.t1_ns), p.t1_ns)
        for step, t1 in end.items():
            out[step] = max(out.get(step, 0.0), (t1 - start[step]) / 1e9)
    return out


def run_trial(request: CheckpointRequest, candidate: CheckpointCandidate, repeat: int) -> CheckpointTrial:
    """Save, measure, restore, compare; a trial that cannot run is recorded failed."""
    with contextlib.ExitStack() as stack:
        work = temp_dir(stack, "iotune-ckpt-work-")
        target = Path(candidate.target or (request.targets[0] if request.targets else request.swap_dir))
        ckpt = temp_dir(stack, CKPT_PREFIX, target) / "checkpoint"
        base, changes = base_config(request), candidate_changes(candidate)
        save_cfg = candidate_config(base, changes, temp_dir(stack, SWAP_PREFIX, Path(request.swap_dir)))
        try:
            saved = save_run(request, candidate, save_cfg, work / "save", ckpt)
            trial = _measured(request, candidate, repeat, saved)
            if trial.status != "ok":
                return trial
            restore_cfg = candidate_config(base, changes, temp_dir(stack, SWAP_PREFIX, Path(request.swap_dir)))
            restored = restore_run(request, candidate, restore_cfg, work / "restore", ckpt)
        except TrialFailed as e:
            return CheckpointTrial(candidate, repeat, "failed", str(e), raw=dict(e.raw))
        check = check_restore(request, save_cfg, saved, restored)
        return replace(trial, restore=check)


def _measured(request: CheckpointRequest, candidate: CheckpointCandidate, repeat: int, saved: Run) -> CheckpointTrial:
    raw = {"returncode": saved.job.returncode, "ended_by": saved.job.ended_by, "seconds": saved.job.seconds,
           "stderr_tail": saved.job.stderr[-1500:]}
    call = _call(saved.att, "save")
    if call is None:
        why = last_line(saved.job.stderr, "no output on stderr")
        if any(f"KeyError: '{v}'" in saved.job.stderr for v in LAUNCHER_VARS):
            why += f"; {launcher_refusal('')}"
        return CheckpointTrial(candidate, repeat, "failed", f"save_checkpoint did not complete (exit "
                               f"{saved.job.returncode}): {why}", raw=raw)
    times = step_times(saved.att)
    before = tuple(times[s] for s in sorted(times) if 0 < s < request.save_at)
    after = tuple(times[s] for s in sorted(times) if request.save_at <= s < request.save_at + request.measure_steps)
    parts: dict[str, int] = {}
    for f in call.files:
        parts[f.part] = parts.get(f.part, 0) + f.bytes
    part_s: dict[str, float] = {}
    for io in call.io:
        part_s[io.part] = part_s.get(io.part, 0.0) + io.seconds
    status = "ok" if saved.job.returncode == 0 or len(after) == request.measure_steps else "failed"
    error = "" if status == "ok" else f"the save run failed after the save (exit {saved.job.returncode}): " \
                                      f"{last_line(saved.job.stderr, 'no output on stderr')}"
    return CheckpointTrial(candidate, repeat, status, error, call.seconds, call.file_bytes, parts, part_s,
                           call.not_durable_bytes(), before, after, None, raw)

