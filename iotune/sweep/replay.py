"""Replaying a job's own swap I/O on a drive (iotune.model.replay.SwapSchedule):
the search's stand-in for real training steps, and the job-pattern ceiling.

- run_replays(): the schedule through DeepSpeed's aio_handle at one aio
  setting, in a child process (python -m iotune.sweep.replayer: torch and
  DeepSpeed stay out of this process) inside the target's cgroup when it has
  one (a capped bed caps the replay as it capped the job), in a scratch
  directory of the target that the ledger records (a hard kill leaves
  nothing behind). The child lays the files out once, then replays them
  `repeats` times.
- job_ceiling(): the schedule without its compute at each aio setting,
  repeated: the best setting's median with its spread, the fastest this
  job's pattern moves on this drive (iotune.model.replay_result.JobCeiling).

What a replay does not represent (parameters moving to NVMe, the pipelined
swappers' overlapping handles, anything whose timing depends on compute)
shows as poor fidelity (model.replay_result.fidelity): callers then measure
real steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import IotuneError, UsageError
from ..host.cgroup import join_cgroup_preexec
from ..host.ledger import temp_dir
from ..host.proc import communicate_watching, kill_group, last_line
from ..model.aio import DEEPSPEED_AIO_DEFAULTS, AioSettings
from ..model.replay import SwapSchedule
from ..model.replay_result import MIN_CEILING_REPEATS, JobCeiling, ReplayResult, SettingRuns, ceiling_from_runs
from ..opbuild.oplocks import BuildLockHang, hang_guard
from ..resources import package_root
from .child import AIO_ABORT
from .executor import Target

REPLAYER_MODULE = "iotune.sweep.replayer"
START_TIMEOUT_S = 300.0          # loading torch and DeepSpeed, a first-use build of the async_io op aside
PER_REPEAT_TIMEOUT_S = 120.0     # on top of the traced time, per repeat (the layout included once)
STDERR_TAIL_CHARS = 4000


class ReplayError(IotuneError):
    """A replay could not run, or did not move the schedule's bytes; the message says why and what to do."""

    def __init__(self, message: str, raw: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.raw = raw or {}


def replay_argv(schedule_file: Path, directory: Path, aio: AioSettings, repeats: int, compute: bool) -> list[str]:
    """The replayer's arguments (after `python -m iotune.sweep.replayer`)."""
    argv = ["--schedule", str(schedule_file), "--dir", str(directory), "--block-size", str(aio.block_size),
            "--queue-depth", str(aio.queue_depth), "--intra-op-parallelism", str(aio.intra_op_parallelism),
            "--single-submit", str(int(aio.single_submit)), "--overlap-events", str(int(aio.overlap_events)),
            "--repeats", str(repeats)]
    return argv + ([] if compute else ["--no-compute"])


def run_replays(schedule: SwapSchedule, target: Target, aio: AioSettings = DEEPSPEED_AIO_DEFAULTS,
                repeats: int = 1, compute: bool = True, timeout_s: float | None = None,
                command: Sequence[str] | None = None) -> tuple[ReplayResult, ...]:
    """`repeats` replays of `schedule` at `aio` on `target` (compute False: the schedule without its
    compute), its sizes as DeepSpeed pads them at aio's intra_op_parallelism (unchanged at the traced
    one). ReplayError if the child fails or any replay moved fewer bytes than the schedule."""
    if aio.use_gds:
        raise UsageError("use_gds: GPUDirect Storage is not replayed (DeepSpeed's aio_handle is); replay with "
                         "use_gds false")
    if repeats < 1:
        raise UsageError(f"repeats must be at least 1, got {repeats}")
    timeout = timeout_s if timeout_s is not None else (
        START_TIMEOUT_S + (repeats + 1) * (PER_REPEAT_TIMEOUT_S + 2 * schedule.traced_s))
    aligned = schedule.for_intra_op_parallelism(aio.intra_op_parallelism)
    with contextlib.ExitStack() as stack:
        files = temp_dir(stack, ".iotune-replay-", target.files_dir)
        plan = temp_dir(stack, ".iotune-replay-schedule-")
        (plan / "schedule.json").write_text(json.dumps(aligned.to_json()))
        base = list(command) if command is not None else [sys.executable, "-m", REPLAYER_MODULE]
        argv = base + replay_argv(plan / "schedule.json", files, aio, repeats, compute)
        data = _run_child(argv, target.cgroup, timeout)
    results = tuple(ReplayResult.from_json(r) for r in data.get("results") or ())
    if len(results) != repeats:
        raise ReplayError(f"the replayer returned {len(results)} results for {repeats} repeats", data)
    short = _shortfall(results)
    if short:
        raise ReplayError(f"the replay did not move the schedule's bytes: {short}", data)
    return results


def run_replay_plan(entries: Sequence[tuple[SwapSchedule, AioSettings]], order: Sequence[int], target: Target,
                    timeout_s: float | None = None, command: Sequence[str] | None = None,
                    directory: Path | None = None) -> tuple[tuple[int, ReplayResult], ...]:
    """Replays of several schedules in one child (`--plan`), each at its aio setting (sizes padded
    as DeepSpeed pads them there), in `order` (indices into `entries`: e.g. a candidate and the
    job's own config in ABBA order): (index, result) per replay, in that order. Their files take
    the sum of the schedules' on the target, in a fresh directory there, or in `directory` (the
    caller's, kept: schedule k's files go under its subdirectory `s<k>`, numbered over the
    schedules with distinct files, which may be links to other drives). ReplayError as run_replays."""
    if any(aio.use_gds for _, aio in entries):
        raise UsageError("use_gds: GPUDirect Storage is not replayed (DeepSpeed's aio_handle is); replay with "
                         "use_gds false")
    if not order or any(not 0 <= i < len(entries) for i in order):
        raise UsageError(f"a replay plan needs an order of indices into its {len(entries)} schedule(s), got "
                         f"{list(order)}")
    timeout = timeout_s if timeout_s is not None else START_TIMEOUT_S + sum(
        PER_REPEAT_TIMEOUT_S + 2 * entries[i][0].traced_s for i in order) + PER_REPEAT_TIMEOUT_S
    plan = {"entries": [{"schedule": s.for_intra_op_parallelism(aio.intra_op_parallelism).to_json(),
                         "aio": aio.to_ds_json()} for s, aio in entries], "order": list(order)}
    with contextlib.ExitStack() as stack:
        files = directory or temp_dir(stack, ".iotune-replay-", target.files_dir)
        where = temp_dir(stack, ".iotune-replay-schedule-")
        (where / "plan.json").write_text(json.dumps(plan))
        base = list(command) if command is not None else [sys.executable, "-m", REPLAYER_MODULE]
        data = _run_child(base + ["--plan", str(where / "plan.json"), "--dir", str(files)], target.cgroup, timeout)
    results = tuple(ReplayResult.from_json(r) for r in data.get("results") or ())
    if len(results) != len(order):
        raise ReplayError(f"the replayer returned {len(results)} results for {len(order)} replays", data)
    short = _shortfall(results)
    if short:
        raise ReplayError(f"the replay did not move the schedule's bytes: {short}", data)
    return tuple(zip(order, results))


def _shortfall(results: Sequence[ReplayResult]) -> str | None:
    """The first short I/O of any replay, or None when every one moved all its bytes."""
    for r in results:
        if r.short_io:
            return r.short_io[0]
        if not r.complete:
            return (f"it moved {r.read_bytes} bytes read and {r.write_bytes} written of {r.expected_read_bytes} "
                    f"and {r.expected_write_bytes}")
    return None


def run_replay(schedule: SwapSchedule, target: Target, aio: AioSettings = DEEPSPEED_AIO_DEFAULTS) -> ReplayResult:
    """One replay of `schedule`, its compute included (what fidelity() compares with the traced step)."""
    return run_replays(schedule, target, aio)[0]


def job_ceiling(schedule: SwapSchedule, target: Target, settings_list: Sequence[AioSettings],
                repeats: int = MIN_CEILING_REPEATS) -> JobCeiling:
    """The schedule without its compute at every setting (e.g. DeepSpeed's defaults and the sweep's
    candidates), `repeats` times each: the best setting's median bytes/s, its spread and count."""
    if repeats < MIN_CEILING_REPEATS:
        raise UsageError(f"a job-pattern ceiling needs at least {MIN_CEILING_REPEATS} repeats per setting "
                         f"(a median and its spread), got {repeats}")
    if not settings_list:
        raise UsageError("a job-pattern ceiling needs at least one aio setting (e.g. DeepSpeed's defaults)")
    runs = []
    for aio in settings_list:
        results = run_replays(schedule, target, aio, repeats, compute=False)
        runs.append(SettingRuns(aio, tuple(r.bytes_per_s for r in results)))
    return ceiling_from_runs(runs, schedule)


# --- the child ---------------------------------------------------------------------------


# what usually sends a signal that ends the replay child
KILLED_WHY = {signal.SIGABRT: AIO_ABORT,
              signal.SIGKILL: " (the kernel's OOM killer does this when host memory runs out: `dmesg | grep -i "
                              "'out of memory'` tells)"}


def _run_child(argv: list[str], cgroup: str | None, timeout_s: float) -> dict[str, Any]:
    proc = _start(argv, cgroup)
    try:
        out, err = communicate_watching(proc, timeout_s, hang_guard(None, "The replay"))
    except BuildLockHang as e:
        _stop(proc)
        raise ReplayError(str(e), {"argv": argv, "build_lock": e.lock.path}) from None
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise ReplayError(f"the replay did not finish within {timeout_s:.0f} s and was killed (a first run builds "
                          "DeepSpeed's async_io op, minutes on 2 cores; a slow drive needs a longer timeout)",
                          {"argv": argv}) from None
    except BaseException:       # Ctrl-C: nothing is left running on the drive
        _stop(proc)
        raise
    return _parse(argv, proc.returncode, out, err)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    kill_group(proc)
    proc.wait()


def _parse(argv: list[str], returncode: int, out: bytes, err: bytes) -> dict[str, Any]:
    raw = {"argv": argv, "returncode": returncode, "stderr_tail": err[-STDERR_TAIL_CHARS:].decode(errors="replace")}
    if returncode < 0:
        raise ReplayError(f"the replay was killed by {signal.Signals(-returncode).name}{KILLED_WHY.get(-returncode, '')}"
                          f"; its stderr ends: {last_line(err)}", raw)
    try:
        data = json.loads(out)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ReplayError(f"the replay (exit status {returncode}) printed no JSON result; its stderr ends: "
                          f"{last_line(err)}", raw)
    if "error" in data or returncode != 0:
        raise ReplayError(str(data.get("error", f"the replay exited with status {returncode}")), {**raw, **data})
    return data


def _start(argv: list[str], cgroup: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root()), env.get("PYTHONPATH", "")) if p)
    preexec = None
    if cgroup is not None:
        if not (Path(cgroup) / "cgroup.procs").is_file():
            raise ReplayError(f"cannot run the replay in cgroup {cgroup}: it has no cgroup.procs (give a cgroup v1 "
                              "directory such as /sys/fs/cgroup/blkio/NAME)")
        preexec = join_cgroup_preexec(cgroup)
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True, preexec_fn=preexec)
    except subprocess.SubprocessError:     # preexec_fn raised
        raise ReplayError(f"cannot run the replay in cgroup {cgroup}: writing its pid to {cgroup}/cgroup.procs "
                          "failed (it needs root)") from None
    except OSError as e:
        raise ReplayError(f"cannot start the replay ({argv[0]}): {e.strerror}") from None
