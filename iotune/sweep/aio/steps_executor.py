"""The steps executor: real training steps of the built-in workload
(strategy nvme-opt, optimizer state swapped to the target directory) with the
point's aio settings; the metric is step and optimizer-step time, the median
over the steps after the first. omp_threads sets OMP_NUM_THREADS for the CPU
optimizer (DeepSpeedCPUAdam), as in the thread table of Xinnor's published offload benchmark.

Runs start warm (iotune.workloads.warmstart): forks of a process that has
imported torch, transformers and DeepSpeed and loaded DeepSpeed's ops, ~5 s a
run instead of ~20 s here; each fork is still a process of its own, in the
target's cgroup. If the warm-start server cannot start, runs are exec'd as
before and the executor says so once.

While a run trains, its steps reach the target's on_step (a progress
display) through the workload's --step-log file, read every WATCH_EVERY_S;
the run's own output stays captured, off the terminal.

A run that waits on a DeepSpeed op-build lock nobody holds or builds under
(opbuild.oplocks.LockWatch, checked every WATCH_EVERY_S) is stopped within
seconds and fails with the lock named; that failure stops the sweep, since
every later run would wait on it too."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...errors import WarmStartUnavailable
from ...host.cgroup import join_cgroup_preexec
from ...host.ledger import private_tmp, temp_dir
from ...opbuild.oplocks import BuildLockHang, hang_guard, release_locks_left_since
from ...host.proc import last_line, run_in_own_group
from ...model.hook_events import hook_env
from ...model.offload import GainSplit, JobShape, OffloadKnobs, gain_split
from ...model.steps import StepFollower, parse_steps
from ...model.sweep import TRIAL_TIMEOUT_S, Measurement, SweepPoint
from ...resources import inject_dir
from ...workloads.presets import PRESETS, tensor_numels
from ...workloads.warmstart import WarmStarter
from ..executor import Target, TrialFailed
from ..user_job import schedule_record


class StepsExecutor:
    name = "steps"
    what = "training steps each"

    def __init__(self, steps: int = 6, size: str = "tiny", strategy: str = "nvme-opt",
                 timeout_s: float = TRIAL_TIMEOUT_S, warm: bool = True) -> None:
        self.steps, self.size, self.strategy, self.timeout_s = steps, size, strategy, timeout_s
        self.warm: WarmStarter | None = WarmStarter() if warm else None
        self.notes: list[str] = []          # what the caller should tell the user (a cold fallback)

    def train_args(self, point: SweepPoint, target: Target, step_log: Path | None = None) -> list[str]:
        return ["--strategy", self.strategy, "--size", self.size, "--steps", str(self.steps),
                "--nvme-path", str(target.files_dir), "--aio-block-size", str(point.block_size),
                "--aio-queue-depth", str(point.queue_depth),
                "--aio-intra-op-parallelism", str(point.intra_op_parallelism),
                *(["--step-log", str(step_log)] if step_log else [])]

    def argv(self, point: SweepPoint, target: Target, step_log: Path | None = None) -> list[str]:
        return [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train",
                *self.train_args(point, target, step_log)]

    def gain_split(self, reference: SweepPoint, candidate: SweepPoint, speedup: float) -> GainSplit | None:
        """The candidate's gain by cause: the built-in workload's tensors are
        known, so are the bytes each point swaps (iotune.model.offload)."""
        if self.strategy != "nvme-opt" or self.size not in PRESETS:
            return None
        shape = JobShape(tuple(tensor_numels(PRESETS[self.size])))
        knobs = [OffloadKnobs(optimizer_device="nvme", block_size=p.block_size,
                              intra_op_parallelism=p.intra_op_parallelism) for p in (reference, candidate)]
        return gain_split(knobs[0], knobs[1], shape, speedup)

    def close(self) -> None:
        """Stop the warm-start server (idempotent; the executor can run again after)."""
        if self.warm is not None:
            self.warm.close()

    def _start(self, point: SweepPoint, target: Target, env: dict[str, str], follow: StepFollower | None = None,
               cold: bool = False) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        watch = hang_guard(env, "The training run")
        step_log = None
        if follow is not None:
            watch, step_log = _watching(watch, follow), follow.path
        if self.warm is not None and not cold:
            try:
                return self.warm.run(self.train_args(point, target, step_log), self.timeout_s, target.cgroup, env,
                                     watch=watch)
            except WarmStartUnavailable as e:
                self.warm.close()
                self.warm = None
                self.notes.append(f"{e}; training runs start cold from here on")
        return run_in_own_group(self.argv(point, target, step_log), self.timeout_s,
                                join_cgroup_preexec(target.cgroup), env=env, watch=watch)

    def run(self, point: SweepPoint, target: Target,
            record_schedule: bool = False) -> tuple[Measurement, dict[str, Any]]:
        """One trial. With `record_schedule`, the run starts cold with iotune's startup hook (a warm fork
        has DeepSpeed imported before the hook could wrap it) and the swap schedule of a steady step is
        kept in the raw record (sweep.user_job.schedule_record), or why there is none."""
        env = dict(os.environ)
        if point.omp_threads:
            env["OMP_NUM_THREADS"] = str(point.omp_threads)
        started = time.time()
        try:
            with contextlib.ExitStack() as stack:    # the run's temporary files go with a recorded directory
                tmp = temp_dir(stack, "iotune-run-")
                if record_schedule:
                    env = hook_env(env, inject_dir(), tmp / "events")
                follow = StepFollower(tmp / "steps.log", self.steps, target.on_step) if target.on_step else None
                proc = self._start(point, target, private_tmp(env, tmp), follow, cold=record_schedule)
                if follow is not None:
                    follow.poll()           # the steps logged after the last look
                measured, raw = self._measured(point, proc)
                if record_schedule:
                    raw.update(schedule_record(tmp / "events", target.files_dir))
                return measured, raw
        except BuildLockHang as e:
            raise TrialFailed(str(e), {"build_lock": e.lock.path}, stops_sweep=True) from None
        except subprocess.TimeoutExpired:
            released = release_locks_left_since(started)
            raise TrialFailed(f"training did not finish within {self.timeout_s:.0f} s"
                              + (f" (a DeepSpeed op build was stopped with it; removed the lock it left: "
                                 f"{', '.join(released)})" if released else "")) from None

    def _measured(self, point: SweepPoint,
                  proc: subprocess.CompletedProcess) -> tuple[Measurement, dict[str, Any]]:  # type: ignore[type-arg]
        records = parse_steps(proc.stdout)
        raw = {"steps": [asdict(r) for r in records], "returncode": proc.returncode}
        if proc.returncode != 0 or not records:
            raise TrialFailed(f"training failed (exit {proc.returncode}): {last_line(proc.stderr, 'no output')}",
                              {**raw, "stderr": proc.stderr[-4000:]})
        ran_with = {r.omp_threads for r in records if r.omp_threads}
        if point.omp_threads and ran_with and ran_with != {point.omp_threads}:
            raise TrialFailed(f"asked for {point.omp_threads} CPU-optimizer threads, the optimizer ran with "
                              f"{', '.join(map(str, sorted(ran_with)))}", raw)
        steady = records[1:] if len(records) > 1 else records
        return Measurement(step_s=statistics.median(r.step_s for r in steady),
                           optimizer_step_s=statistics.median(r.optimizer_step_s for r in steady)), raw


def _watching(watch: Callable[[], None], follow: StepFollower) -> Callable[[], None]:
    """`watch`, then the steps the run logged since the last call."""
    def check() -> None:
        watch()
        follow.poll()
    return check
