"""One trial of the whole-offload search: the job run once under a
candidate's DeepSpeed config, measured through the startup hook `iotune
trace` uses (steps, locked memory and peak RSS, the model's tensors, every
swapped byte, the time the training thread waited on swaps).

Two runners, one code path: the user's own command (`--steps-cmd`), or the
built-in workload (`python -m iotune.workloads.train`), named on purpose
with `--model`, run as a command so that the same hook sees it.

A trial runs at most `TrialPlan.steps` optimizer steps and ends as soon as
its steady steps (those after the first, which also creates Adam's moments)
agree within `TrialPlan.agree`: at the 1B scale a step takes about a
minute, and a third step that says what the second said buys nothing."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from ...host.proc import last_line
from ...model.hook_events import (JobTensors, MemorySample, read_events, read_io_waits, read_memory,
                                 read_tensors, step_timings)
from ...model.sweep import TRIAL_TIMEOUT_S
from ...workloads.presets import PRESETS
from ..user_job import PLACEHOLDER, UserJob, probe_shape, run_with_config


@dataclass(frozen=True)
class TrialPlan:
    """How long one trial runs: up to `steps` optimizer steps, ended once
    `min_steps` are done and the steady ones agree within `agree` (the
    largest over the smallest of them, minus 1); `timeout_s` kills it."""

    steps: int = 4
    min_steps: int = 3
    agree: float = 0.05
    timeout_s: float = TRIAL_TIMEOUT_S


class RunResult(NamedTuple):
    status: str                       # ok | failed
    samples_per_s: float = 0.0
    optimizer_step_s: float = 0.0
    step_s: float = 0.0
    locked_bytes: int = 0
    rss_bytes: int = 0
    error: str = ""
    tensors: JobTensors | None = None     # the job's parameter tensors, as its hook saw them
    swap_bytes: dict[str, int] = {}       # category -> bytes swapped (read + write) per steady step, all ranks
    io_wait_s: float = 0.0                # median per steady step: the training thread blocked on swap I/O
    step_times_s: tuple[float, ...] = ()  # every steady step's time, in order
    peak_rss_bytes: int = 0               # VmHWM, the largest rank's


class Runner(Protocol):
    """Runs one trial of the job under a config: the built-in workload, or the user's command."""

    @property
    def what(self) -> str: ...

    @property
    def seq_len(self) -> int: ...     # tokens per sample, 0 where unknown

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, plan: TrialPlan) -> RunResult:
        ...

    def probe(self, cfg: dict[str, Any], work: Path, cgroup: str | None,
              timeout_s: float) -> tuple[JobTensors | None, str]:
        """The job started once and stopped at deepspeed.initialize: its
        tensors and its process's memory then (None, why: not seen)."""
        ...


def steady_agree(plan: TrialPlan) -> Callable[[Path], bool]:
    """The early-end rule of `plan`, on a trial's events directory."""
    def enough(events: Path) -> bool:
        steady = [t.step_s for t in step_timings(read_events(events))][1:]
        if len(steady) + 1 < plan.min_steps or len(steady) < 2:
            return False
        return max(steady) / min(steady) - 1 <= plan.agree
    return enough


@dataclass(frozen=True)
class CommandRunner:
    """The job's command, its config replaced by the candidate's."""

    job: UserJob
    seq_len: int = 0
    env: tuple[tuple[str, str], ...] = ()     # added to the command's environment
    label: str = ""                           # what the reports call it (default: the command)

    @property
    def what(self) -> str:
        return self.label or f"`{' '.join(self.job.argv)}`"

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, plan: TrialPlan) -> RunResult:
        _, job = run_with_config(self.job, cfg, work, cgroup, plan.timeout_s, plan.steps, dict(self.env),
                                 steady_agree(plan))
        events = work / "events"
        att = read_events(events)
        timings, tensors = step_timings(att), read_tensors(events)
        waits = read_io_waits(events)
        needed = plan.min_steps if job.ended_by == "enough" else plan.steps
        locked, rss, peak = memory_seen(read_memory(events), tensors)
        if len(timings) < needed:
            why = (f"did not complete {plan.steps} optimizer steps within {plan.timeout_s:g} s (--steps-timeout); "
                   f"{len(timings)} seen" if job.ended_by == "time limit" else
                   f"{len(timings)} of {plan.steps} steps (exit {job.returncode}, {job.ended_by or 'exited'})")
            return RunResult("failed", error=f"{why}: {failure_line(job.returncode, job.stderr)}", tensors=tensors,
                             locked_bytes=locked, rss_bytes=rss, peak_rss_bytes=peak)
        steady = timings[1:] or timings
        step_s = statistics.median(t.step_s for t in steady)
        world = tensors.world if tensors else 1
        return RunResult("ok", samples_per_step(cfg) * world / step_s,
                         statistics.median(t.optimizer_step_s for t in steady), step_s, locked, rss, tensors=tensors,
                         swap_bytes=steady_swap_bytes(att, {t.step for t in steady}),
                         io_wait_s=statistics.median(waits.get(t.step, 0.0) for t in steady),
                         step_times_s=tuple(round(t.step_s, 6) for t in steady), peak_rss_bytes=peak)

    def probe(self, cfg: dict[str, Any], work: Path, cgroup: str | None,
              timeout_s: float) -> tuple[JobTensors | None, str]:
        return probe_shape(self.job, cfg, work, cgroup, timeout_s, dict(self.env))


def memory_seen(samples: list[MemorySample], tensors: JobTensors | None) -> tuple[int, int, int]:
    """(locked, RSS, peak RSS) bytes from what the hook wrote, however far the
    job got: the largest VmLck and VmRSS after a step or at its exit, and its
    VmHWM, at least what it was at deepspeed.initialize (0: nothing seen)."""
    at_init = tensors.startup.peak_rss_bytes if tensors is not None and tensors.startup is not None else 0
    return (max((m.locked_bytes for m in samples), default=0), max((m.rss_bytes for m in samples), default=0),
            max([at_init, *(m.peak_rss_bytes for m in samples)]))


OOM_EXITS = (-9, 137)


def failure_line(returncode: int, stderr: str) -> str:
    """The job's last stderr line; for a SIGKILL with no message, what
    usually sends it (the kernel's OOM killer leaves no Python traceback)."""
    line = last_line(stderr, "no message")
    if returncode in OOM_EXITS:
        return (f"killed by SIGKILL ({line}): the kernel's OOM killer does this when host memory runs out "
                f"(`dmesg | grep -i 'out of memory'` tells)")
    return line


def steady_swap_bytes(att: Any, steps: set[int]) -> dict[str, int]:
    """Bytes swapped per step in `steps` (reads + writes, every rank), by category."""
    out: dict[str, int] = {}
    for s in att.swaps if att else ():
        if s.step in steps:
            out[s.category] = out.get(s.category, 0) + s.bytes
    return {k: v // max(len(steps), 1) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class BuiltinRunner:
    """The built-in workload, named on purpose (`--model`), run as a command
    so that the same hook sees its steps, memory and swaps."""

    size: str
    seq_len_override: int | None = None

    @property
    def what(self) -> str:
        return f"the built-in {self.size} model (sequence {self.seq_len})"

    @property
    def seq_len(self) -> int:
        return self.seq_len_override or (PRESETS[self.size].seq_len if self.size in PRESETS else 0)

    def argv(self, steps: int) -> tuple[str, ...]:
        seq = ("--seq-len", str(self.seq_len_override)) if self.seq_len_override else ()
        return (sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config", PLACEHOLDER,
                "--size", self.size, "--steps", str(steps), *seq)

    def command(self, cfg: dict[str, Any], steps: int, timeout_s: float) -> CommandRunner:
        """The built-in workload as the command it runs as."""
        env = (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
               ("MASTER_PORT", str(29500 + os.getpid() % 5000)))
        job = UserJob(self.argv(steps), Path("ds_config.json"), cfg, steps, timeout_s)
        return CommandRunner(job, self.seq_len, env, self.what)

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, plan: TrialPlan) -> RunResult:
        return self.command(cfg, plan.steps, plan.timeout_s).run(cfg, work, cgroup, plan)

    def probe(self, cfg: dict[str, Any], work: Path, cgroup: str | None,
              timeout_s: float) -> tuple[JobTensors | None, str]:
        return self.command(cfg, 1, timeout_s).probe(cfg, work, cgroup, timeout_s)


def samples_per_step(cfg: dict[str, Any]) -> int:
    return int(cfg.get("train_micro_batch_size_per_gpu", 1)) * int(cfg.get("gradient_accumulation_steps", 1))
