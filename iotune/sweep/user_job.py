"""The user-command executor ("cmd"): the user's own DeepSpeed job as the
closed loop of a sweep (`iotune sweep --steps-cmd "..." --ds-config FILE`).

Each trial writes a copy of the user's DeepSpeed config with the point's
`aio` keys (sweep.config.candidate_config: nothing else of the user's
config changes, use_gds included), runs the command with `{config}` replaced by that copy's path,
and reads step and optimizer-step times back through the startup hook
`iotune trace` uses (model.hook_events; the hook directory comes from
iotune.resources, so nothing here imports trace):

- nvme_path: the sweep tunes the drive at --path, so every NVMe offload
  section of the copy swaps to a fresh directory iotune creates under --path
  (iotune-swap-XXXX), whatever nvme_path the user's file names. The user's
  own swap directory is never touched; the trial's is removed after it, so
  no candidate starts with another's swap files.
- bounds: the hook ends every rank with SystemExit(0) right after its
  `steps`-th optimizer step (IOTUNE_MAX_STEPS); a job that outlives that by
  STOP_GRACE_S (it caught SystemExit, or hangs in shutdown) is killed, and
  its steps still count; so do they when it crashes in shutdown after them
  (DeepSpeed's aio threads can abort the interpreter's exit: "terminate
  called without an active exception", exit -6); the trial's raw record
  keeps that exit. A wall-clock limit kills the process group.
- metric: the median step and optimizer-step time over the steps after
  the first (per step the slowest rank).
- build locks: until every rank completed a step, a DeepSpeed op-build
  lock that nobody holds or builds under (opbuild.oplocks.LockWatch) ends
  the trial within seconds, failed with the lock named, and stops the
  sweep: the job would wait on it until the time limit, and so would every
  later trial.
- progress: each step the hook reports reaches the target's on_step (a
  progress display; no loss: the hook times steps, it does not see the
  loss); the job's output stays in the trial's stdout.log and stderr.log.
- omp_threads: sets OMP_NUM_THREADS; a job that overrides it in its ranks
  (e.g. the launcher's --bind_cores_to_rank) fails the trial instead of being
  measured at a thread count it did not run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..host.cgroup import join_cgroup_preexec
from ..host.ledger import private_tmp, temp_dir
from ..opbuild.oplocks import LockWatch, build_locks, extension_roots, hang_note, release_locks_left_since
from ..host.proc import kill_group, kill_session, last_line
from ..dsconfig import read_ds_config
from ..errors import UsageError
from ..model.hook_events import (
    HookProcess,
    JobTensors,
    MemorySample,
    StepTiming,
    completed_steps,
    hook_env,
    read_events,
    read_memory,
    read_processes,
    read_tensors,
    step_timings,
)
from ..model.replay import ScheduleError, read_swap_schedule
from ..model.steps import StepProgress
from ..model.sweep import TRIAL_TIMEOUT_S, Measurement, SweepPoint
from ..resources import inject_dir
from .config import aio_block_changes, candidate_config, nvme_sections
from .executor import Target, TrialFailed

PLACEHOLDER = "{config}"
SWAP_PREFIX = "iotune-swap-"
STOP_GRACE_S = 30.0
POLL_S = 1.0
TAIL_CHARS = 4000


@dataclass(frozen=True)
class UserJob:
    """The user's training command and DeepSpeed config, as given."""

    argv: tuple[str, ...]                # contains PLACEHOLDER
    config_path: Path
    config: dict[str, Any] = field(default_factory=dict)
    steps: int = 6                       # optimizer steps per trial
    timeout_s: float = TRIAL_TIMEOUT_S   # wall-clock limit per trial

    def identity(self) -> dict[str, Any]:
        """What the trials depend on (journal header): a journal resumes
        only for the same command and the same config contents."""
        text = json.dumps(self.config, sort_keys=True)
        return {"argv": list(self.argv), "ds_config": str(self.config_path),
                "ds_config_sha1": hashlib.sha1(text.encode()).hexdigest()[:12], "steps": self.steps}


def refuse_other_models(ds_config: Path | None, steps_cmd: str | None, model: str | None,
                        seq_len: int | None = None) -> None:
    """No path tunes a model other than the user's: a config without the
    command that trains it is refused, unless a built-in model is named."""
    if ds_config is not None and not steps_cmd and model is None:
        raise UsageError(f"--ds-config {ds_config} without --steps-cmd would tune a built-in model with your "
                         f"config, not your model: give --steps-cmd \"YOUR TRAINING COMMAND ... {{config}}\" to run "
                         f"your own job, or name a built-in model with --model PRESET to tune that one on purpose")
    if steps_cmd and model is not None:
        raise UsageError("--model names a built-in model, and --steps-cmd runs your own: give one of them")
    if seq_len is not None and steps_cmd:
        raise UsageError("--seq-len sets the built-in model's sequence: your command (--steps-cmd) sets its own")


def parse_user_job(command: str, ds_config: Path | None, steps: int, timeout_s: float,
                   need_nvme: bool = True) -> UserJob:
    """--steps-cmd and --ds-config, checked before anything runs (`need_nvme`:
    the config must swap to NVMe already, as the aio sweep needs)."""
    try:
        argv = tuple(shlex.split(command))
    except ValueError as e:
        raise UsageError(f"--steps-cmd {command!r}: {e} (quote it as one shell word)") from None
    if not argv:
        raise UsageError("--steps-cmd is empty: give your training command, e.g. "
                         "--steps-cmd \"deepspeed train.py --deepspeed_config {config}\"")
    if not any(PLACEHOLDER in a for a in argv):
        raise UsageError(f"--steps-cmd has no {PLACEHOLDER} placeholder: put {PLACEHOLDER} where your job takes "
                         f"its DeepSpeed config, e.g. --steps-cmd \"{' '.join(argv)} --deepspeed_config "
                         f"{PLACEHOLDER}\"; iotune writes each candidate's config to a file and puts its path there")
    if "/" not in argv[0] and shutil.which(argv[0]) is None:
        raise UsageError(f"--steps-cmd: command not found: {argv[0]} (check the name, or give its full path)")
    if ds_config is None:
        raise UsageError("--steps-cmd needs --ds-config FILE: your DeepSpeed config, into whose copies iotune "
                         "writes each candidate's aio block")
    config = read_ds_config(ds_config)
    if need_nvme and not nvme_sections(config):
        raise UsageError(f"{ds_config} offloads nothing to NVMe, so aio settings cannot change its steps: set "
                         f"zero_optimization.offload_optimizer (or offload_param) to "
                         f"{{\"device\": \"nvme\", \"nvme_path\": ...}}")
    return UserJob(argv, ds_config, config, steps, timeout_s)


def swap_note(job: UserJob, target_dir: Path) -> str:
    """What the trials do with the user's nvme_path, said once per sweep."""
    paths = sorted(set(nvme_sections(job.config).values()) - {""})
    where = f"nvme_path {', '.join(paths)} in {job.config_path}" if paths else f"{job.config_path}'s NVMe offload"
    root = target_dir.resolve()
    on_target = paths and all(Path(p).resolve().is_relative_to(root) for p in paths)
    why = ("(same drive)" if on_target else
           "instead, since the sweep tunes the drive at --path (set your nvme_path there to use the result)")
    return (f"sweep: {where}: each trial's config copy swaps to a fresh directory {target_dir}/{SWAP_PREFIX}* "
            f"{why}; it is removed after every trial")


@dataclass(frozen=True)
class JobRun:
    returncode: int
    seconds: float
    ended_by: str          # "" (exited by itself) | "time limit" | "grace" | "build lock" | "enough"
    stdout: str            # the last TAIL_CHARS characters
    stderr: str
    build_lock: str = ""   # ended_by "build lock": what it waited on, and the fix
    lock_path: str = ""


def schedule_record(events_dir: Path, swap_dir: Path | None) -> dict[str, Any]:
    """What a recording run adds to its raw record: {"schedule": the swap schedule of a steady step
    (SwapSchedule.to_json, paths relative to `swap_dir`)}, or {"schedule_error": why} when the hook's
    events in `events_dir` hold none."""
    try:
        schedule = read_swap_schedule(events_dir, swap_dir=str(swap_dir) if swap_dir is not None else None)
    except ScheduleError as e:
        return {"schedule_error": str(e)}
    return {"schedule": schedule.to_json()}


class CommandExecutor:
    name = "cmd"

    def __init__(self, job: UserJob) -> None:
        self.job = job
        self.what = f"optimizer steps each of `{shlex.join(job.argv)}`"

    def run(self, point: SweepPoint, target: Target,
            record_schedule: bool = False) -> tuple[Measurement, dict[str, Any]]:
        """One trial; with `record_schedule`, the swap schedule of a steady step is kept in the raw
        record (schedule_record), or why there is none."""
        with contextlib.ExitStack() as stack:
            work = temp_dir(stack, "iotune-cmd-")
            swap = temp_dir(stack, SWAP_PREFIX, target.files_dir)
            extra = {"OMP_NUM_THREADS": str(point.omp_threads)} if point.omp_threads else {}
            config = candidate_config(self.job.config, aio_block_changes(point.aio()), swap)
            argv, job = run_with_config(self.job, config, work, target.cgroup, self.job.timeout_s, self.job.steps,
                                        extra, on_step=target.on_step)
            measured, raw = self._measure(point, argv, job, work / "events", swap)
            if record_schedule:
                raw.update(schedule_record(work / "events", swap))
            return measured, raw

    def _measure(self, point: SweepPoint, argv: list[str], job: JobRun, events: Path,
                 swap: Path) -> tuple[Measurement, dict[str, Any]]:
        att = read_events(events)
        steps = step_timings(att)
        procs = read_processes(events)
        raw: dict[str, Any] = {
            "command": argv, "returncode": job.returncode, "ended_by": job.ended_by, "seconds": job.seconds,
            "steps": [asdict(s) for s in steps], "ranks": list(att.ranks) if att else [],
            "swap_bytes": _swap_bytes(att), "omp_threads_seen": sorted({str(p.omp_threads) for p in procs}),
            "memory": _peak_memory(read_memory(events)),
            "stdout_tail": job.stdout, "stderr_tail": job.stderr,
        }
        _check(self.job, point, job, steps, procs, swap, raw)
        steady = steps[1:] if len(steps) > 1 else steps
        return Measurement(step_s=statistics.median(s.step_s for s in steady),
                           optimizer_step_s=statistics.median(s.optimizer_step_s for s in steady)), raw


def _check(job: UserJob, point: SweepPoint, run: JobRun, steps: list[StepTiming], procs: list[HookProcess],
           swap: Path, raw: dict[str, Any]) -> None:
    """TrialFailed naming what went wrong, or nothing when the trial counts."""
    stderr = last_line(run.stderr, "no output on stderr")
    if run.ended_by == "build lock":
        raise TrialFailed(run.build_lock, {**raw, "build_lock": run.lock_path}, stops_sweep=True)
    if run.ended_by == "time limit" and len(steps) < job.steps:
        raise TrialFailed(f"your command did not complete {job.steps} optimizer steps within {job.timeout_s:g} s "
                          f"(--steps-timeout); {len(steps)} seen; last stderr line: {stderr}"
                          f"{_lock_hint(time.time() - run.seconds)}", raw)
    if run.returncode != 0 and not run.ended_by:
        if len(steps) < job.steps:
            raise TrialFailed(f"your command failed (exit {run.returncode}): {stderr}", raw)
        raw["shutdown"] = f"exit {run.returncode} after its {len(steps)} steps: {stderr}"
    if not steps:
        raise TrialFailed("no optimizer step was seen: is it a DeepSpeed job? iotune times "
                          "DeepSpeedEngine.step() through a startup hook on PYTHONPATH, so the command must train "
                          "with DeepSpeed in Python (a launcher that drops PYTHONPATH, or python -I/-E, hides the "
                          f"hook); exit {run.returncode}, last stderr line: {stderr}", raw)
    if not any(swap.rglob("*.swp")):
        raise TrialFailed(f"your command swapped nothing to {swap}: it must hand {PLACEHOLDER} to DeepSpeed "
                          f"(deepspeed.initialize(config=path) or --deepspeed_config {PLACEHOLDER}), or the "
                          f"candidate's aio settings never reach it", raw)
    want = str(point.omp_threads)
    if point.omp_threads and any(p.omp_threads != want for p in procs):
        seen = ", ".join(raw["omp_threads_seen"])
        raise TrialFailed(f"OMP_NUM_THREADS was set to {want}, but the job's processes ran with {seen}: the "
                          f"command (or its launcher's --bind_cores_to_rank) overrides it; remove that, or drop "
                          f"--omp-threads", raw)


def _lock_hint(since: float) -> str:
    """After the time limit stopped a trial that began at `since`: remove the
    locks its stopped op build left, and name any other lock it may have
    waited on."""
    released = release_locks_left_since(since)
    done = (f"; the time limit stopped a DeepSpeed op build, whose lock was removed: {', '.join(released)}"
            if released else "")
    locks = build_locks(extension_roots())
    if not locks:
        return done
    return done + (f"; DeepSpeed op build lock(s) exist: {', '.join(lk.path for lk in locks)}: a job waits on "
                   f"them silently, and one killed mid-build leaves its lock behind; if no DeepSpeed op is being "
                   f"built, remove them")


def _peak_memory(samples: list[MemorySample]) -> dict[str, int]:
    """The largest locked memory and RSS any rank reported after a step (bytes; 0: none reported)."""
    return {"locked_bytes": max((m.locked_bytes for m in samples), default=0),
            "rss_bytes": max((m.rss_bytes for m in samples), default=0)}


def _swap_bytes(att: Any) -> dict[str, int]:
    out = {"read": 0, "write": 0}
    for s in att.swaps if att else ():
        out[s.direction] = out.get(s.direction, 0) + s.bytes
    return out


def run_with_config(job: UserJob, config: dict[str, Any], work: Path, cgroup: str | None, timeout_s: float,
                    steps: int, extra_env: dict[str, str] | None = None,
                    enough: Callable[[Path], bool] | None = None, shape_only: bool = False,
                    on_step: Callable[[StepProgress], None] | None = None) -> tuple[list[str], JobRun]:
    """The user's command with `config` written into `work` (under the name
    of their config file) in place of {config}, the startup hook writing its
    events to work/events; stopped after `steps` optimizer steps, or sooner
    when `enough(events)` says so (with `shape_only`: at deepspeed.initialize,
    once the hook reported the model's tensors); `on_step` is told each step.
    (argv, run)."""
    path = work / (job.config_path.name if job.config_path.suffix == ".json" else "ds_config.json")
    path.write_text(json.dumps(config, indent=2) + "\n")
    events = work / "events"
    events.mkdir()
    argv = [a.replace(PLACEHOLDER, str(path)) for a in job.argv]
    env = private_tmp({**hook_env(dict(os.environ), inject_dir(), events, steps, shape_only), **(extra_env or {})},
                      work / "tmp")
    return argv, run_job(argv, env, cgroup, timeout_s, work, events, steps, enough, on_step)


def probe_shape(job: UserJob, config: dict[str, Any], work: Path, cgroup: str | None, timeout_s: float,
                extra_env: dict[str, str] | None = None) -> tuple[JobTensors | None, str]:
    """The job's parameter tensors, from a run stopped at deepspeed.initialize
    (nothing of DeepSpeed's buffers is allocated); (None, why) without them."""
    _, run = run_with_config(job, config, work, cgroup, timeout_s, 1, extra_env, shape_only=True)
    tensors = read_tensors(work / "events")
    if tensors is not None:
        return tensors, ""
    why = run.build_lock or f"exit {run.returncode}, {run.ended_by or 'exited'}: {last_line(run.stderr, 'no message')}"
    return None, why


def run_job(argv: list[str], env: dict[str, str], cgroup: str | None, timeout_s: float, logs: Path,
            events: Path, steps: int, enough: Callable[[Path], bool] | None = None,
            on_step: Callable[[StepProgress], None] | None = None) -> JobRun:
    """Run the job as its own process group, output to files in `logs`.
    Killed (the whole group) at the time limit, or STOP_GRACE_S after every
    rank completed `steps` steps, or as soon as `enough(events)` holds after
    a step (ended_by "enough": its steps agree, more would tell nothing), or
    as soon as it waits, before its first step, on a build lock nobody
    holds; any interruption kills it too. `on_step` is told each step the
    hook reports, as it is seen (every POLL_S)."""
    out_path, err_path = logs / "stdout.log", logs / "stderr.log"
    t0 = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True,
                                    preexec_fn=join_cgroup_preexec(cgroup))
        except OSError as e:
            raise TrialFailed(f"cannot run {argv[0]}: {e.strerror}") from None
    ended_by, done_at, seen = "", None, 0
    locks, hang = LockWatch(env), None
    tell = _step_teller(events, steps, on_step) if on_step is not None else None
    try:
        while True:
            try:
                proc.wait(POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            done = completed_steps(events)
            if tell is not None:
                tell(done)
            if done > seen and done < steps and enough is not None and enough(events):
                ended_by = "enough"
                kill_group(proc)
                proc.wait()
                break
            seen = done
            if done_at is None and done >= steps:
                done_at = now
            hang = next(iter(locks.poll()), None) if done == 0 else None
            if hang is not None:
                ended_by = "build lock"
                kill_group(proc)
                proc.wait()
                break
            if now - t0 > timeout_s or (done_at is not None and now - done_at > STOP_GRACE_S):
                ended_by = "time limit" if done_at is None else "grace"
                kill_group(proc)
                proc.wait()
                break
    finally:
        kill_group(proc)      # ranks a launcher left behind, and on any interruption
        kill_session(proc.pid)     # and what left the group (ninja's compilers of an op build)
        proc.wait()
    if tell is not None:
        tell(completed_steps(events))      # those after the last look
    return JobRun(proc.returncode, round(time.monotonic() - t0, 3), ended_by, _tail(out_path), _tail(err_path),
                  hang_note(hang, f"The trial's job ({argv[0]}) had not completed a training step after "
                                  f"{time.monotonic() - t0:.0f} s: it waits on this lock, as would every later "
                                  f"trial.") if hang else "", hang.path if hang else "")


def _step_teller(events: Path, steps: int, on_step: Callable[[StepProgress], None]) -> Callable[[int], None]:
    """tell(done): `on_step` each step up to `done` (of `steps`) not told
    yet, with its time (the slowest rank's); made: the job started."""
    told = 0
    on_step(StepProgress(0, steps))

    def tell(done: int) -> None:
        nonlocal told
        if done <= told:
            return
        timings = step_timings(read_events(events))[:min(done, steps)]
        for n, t in enumerate(timings[told:], told + 1):
            on_step(StepProgress(n, steps, t.step_s))
        told = max(told, len(timings))
    return tell


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - TAIL_CHARS))
        return fh.read().decode(errors="replace")
