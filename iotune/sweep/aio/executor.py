"""The `aio` executor: measures a SweepPoint with DeepSpeed's own aio engine
(`aio_handle`, what ZeRO-Infinity's swapper uses), in a child process that
runs iotune.sweep.aio.bench, so torch and DeepSpeed never load into the sweep.

The child gets an argument list, its own session (a timeout kills it and
anything it started, such as a first-use JIT build of the op), and joins
`target.cgroup` before exec. Its stdout is one JSON object; its stderr is
DeepSpeed's noise, kept apart and quoted only when a trial fails.

`point.engine` is always libaio here (the CLI refuses --engines io_uring with this
executor) and `point.omp_threads` is 0 (threads are a training-step dimension).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...host.cgroup import join_cgroup_preexec
from ...opbuild.oplocks import BuildLockHang, hang_guard
from ...host.proc import communicate_watching, kill_group, last_line
from ...model.sweep import Measurement, SweepPoint
from ...resources import package_root
from .bench import BenchConfig, swap_paths
from ..child import AIO_ABORT
from ..executor import Target, TrialFailed

BENCH_MODULE = "iotune.sweep.aio.bench"
DEFAULT_TIMEOUT_S = 600.0        # a first run JIT-builds the async_io op: about 134 s on 2 cores
STDERR_TAIL_CHARS = 4000


class AioExecutor:
    """`pin`: page-locked buffers from aio_handle.new_cpu_locked_tensor, as the
    swapper's buffer pool uses (False: plain memory, which DeepSpeed copies
    through a bounce buffer). `command`: how to start the bench (tests
    substitute a fake)."""

    name = "aio"

    def __init__(self, *, pin: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                 command: Sequence[str] | None = None) -> None:
        self.pin = pin
        self.timeout_s = timeout_s
        self.command = list(command) if command is not None else [sys.executable, "-m", BENCH_MODULE]

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        config = BenchConfig.for_trial(point, target, self.pin)
        argv = [*self.command, *config.to_argv()]
        problem = config.layout_problem()
        if problem:       # the bench refuses these too; saying so here saves importing torch
            raise TrialFailed(problem, {"argv": argv, "error": problem, "kind": "usage"})
        proc = _start(argv, target.cgroup)
        try:
            out, err = communicate_watching(proc, self.timeout_s, hang_guard(None, "The aio trial"))
        except BuildLockHang as e:
            kill_group(proc)
            proc.wait()
            _remove_leftovers(target, proc.pid)
            raise TrialFailed(str(e), {"argv": argv, "build_lock": e.lock.path}, stops_sweep=True) from None
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            _remove_leftovers(target, proc.pid)
            raise TrialFailed(f"the aio trial did not finish within {self.timeout_s:g} s and was killed "
                              "(a first run builds DeepSpeed's async_io op, about 2-3 minutes on 2 cores; "
                              "a throttled drive needs a longer timeout or smaller files)",
                              _failure_raw(argv, proc.returncode, err)) from None
        except BaseException:            # Ctrl-C: nothing is left running on the drive
            kill_group(proc)
            proc.wait()
            _remove_leftovers(target, proc.pid)
            raise
        if proc.returncode != 0:
            _remove_leftovers(target, proc.pid)
        return parse_result(argv, proc.returncode, out, err, point.block_size)


def parse_result(argv: list[str], returncode: int, out: bytes, err: bytes,
                 block_size: int) -> tuple[Measurement, dict[str, Any]]:
    """The bench's JSON as (Measurement, raw); TrialFailed for anything else."""
    raw = _failure_raw(argv, returncode, err)
    if returncode < 0:
        name = signal.Signals(-returncode).name
        why = AIO_ABORT if -returncode == signal.SIGABRT else ""
        raise TrialFailed(f"the aio trial was killed by {name}{why}; its stderr ends: {last_line(err)}", raw)
    try:
        data = json.loads(out)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raw["stdout"] = out[:STDERR_TAIL_CHARS].decode(errors="replace")
        raise TrialFailed(f"the aio trial (exit status {returncode}) printed no JSON result; "
                          f"its stderr ends: {last_line(err)}", raw)
    if "error" in data:
        raise TrialFailed(str(data["error"]), {**raw, **data})
    if returncode != 0:
        raise TrialFailed(f"the aio trial exited with status {returncode} but reported no error", {**raw, **data})
    if data.get("verified") is not True:
        raise TrialFailed("the aio trial did not confirm that the data read back equals what it wrote",
                          {**raw, **data})
    return _measurement(data, block_size, raw), data


def _measurement(data: dict[str, Any], block_size: int, raw: dict[str, Any]) -> Measurement:
    try:
        write = float(data["write_bytes_per_s"])
        read = float(data["read_bytes_per_s"])
    except (KeyError, TypeError, ValueError):
        raise TrialFailed("the aio trial's result lacks numeric write_bytes_per_s and read_bytes_per_s",
                          {**raw, **data}) from None
    if not (write > 0 and read > 0):
        raise TrialFailed(f"the aio trial reported non-positive bandwidth (write {write}, read {read} bytes/s)",
                          {**raw, **data})
    return Measurement(read_bytes_per_s=read, write_bytes_per_s=write,
                       read_iops=read / block_size, write_iops=write / block_size)


def _start(argv: list[str], cgroup: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root()), env.get("PYTHONPATH", "")) if p)
    preexec = None
    if cgroup is not None:
        procs = Path(cgroup) / "cgroup.procs"
        if not procs.is_file():
            raise TrialFailed(f"cannot run the trial in cgroup {cgroup}: {procs} does not exist (give a cgroup "
                              "v1 directory such as /sys/fs/cgroup/blkio/NAME)", {"argv": argv})
        preexec = join_cgroup_preexec(str(cgroup))
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True, preexec_fn=preexec)
    except subprocess.SubprocessError:     # preexec_fn raised
        raise TrialFailed(f"cannot run the trial in cgroup {cgroup}: writing the child's pid to "
                          f"{cgroup}/cgroup.procs failed (it needs root)", {"argv": argv}) from None
    except OSError as e:
        raise TrialFailed(f"cannot start the aio trial ({argv[0]}): {e.strerror}", {"argv": argv}) from None


def _remove_leftovers(target: Target, pid: int) -> None:
    """A killed or aborted bench leaves its files behind; they are named by its pid."""
    for path in swap_paths(target.files_dir, pid, target.files):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _failure_raw(argv: list[str], returncode: int | None, err: bytes) -> dict[str, Any]:
    return {"argv": argv, "returncode": returncode,
            "stderr_tail": err[-STDERR_TAIL_CHARS:].decode(errors="replace")}
