"""Warm starts of the built-in workload (iotune.workloads.warmstart): forks of a
process that has imported torch, transformers and DeepSpeed. Each fork must
compute exactly what an exec'd run computes, with the run's own thread
count, cgroup and time limit, and a server that dies must not cost a trial."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from iotune.host.cgroup import Throttle, blkio_cgroup
from iotune.host.proc import run_in_own_group
from iotune.model.steps import StepProgress, parse_steps
from iotune.model.sweep import SweepPoint
from iotune.sweep.executor import Target
from iotune.sweep.aio import recommend
from iotune.sweep.aio.recommend import ds_fragment, validate_with_deepspeed
from iotune.sweep.aio.steps_executor import StepsExecutor
from iotune.errors import WarmStartUnavailable
from iotune.workloads.warmstart import WarmStarter

from tests.conftest import ext4_mount, needs_deepspeed, needs_root

pytestmark = needs_deepspeed


def train_args(path: Path, steps: int = 3) -> list[str]:
    return ["--strategy", "nvme-opt", "--size", "tiny", "--steps", str(steps), "--nvme-path", str(path)]


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_a_warm_run_computes_what_a_cold_run_computes_with_its_own_threads(tmp_path: Path) -> None:
    with WarmStarter() as warm:
        for threads in ("1", "2"):
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            w = warm.run(train_args(tmp_path), 600, env=env)
            c = subprocess.run([sys.executable, "-W", "ignore", "-m", "iotune.workloads.train",
                                *train_args(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
            assert (w.returncode, c.returncode) == (0, 0), (w.stderr[-2000:], c.stderr[-2000:])
            warm_steps, cold_steps = parse_steps(w.stdout), parse_steps(c.stdout)
            # the same computation; a forked process's buffers sit at other addresses than a fresh one's, and
            # vectorised float reductions may then sum in another order: equal to float32 rounding, not bitwise
            assert len(warm_steps) == len(cold_steps) == 3
            assert all(math.isclose(w_.loss, c_.loss, rel_tol=1e-6) for w_, c_ in zip(warm_steps, cold_steps)), \
                ([s.loss for s in warm_steps], [s.loss for s in cold_steps])
            assert {s.omp_threads for s in warm_steps} == {s.omp_threads for s in cold_steps} == {int(threads)}
        assert children(warm.server.pid) == []          # each run was reaped  # type: ignore[union-attr]


def test_a_failing_run_returns_its_exit_status_and_message(tmp_path: Path) -> None:
    with WarmStarter() as warm:
        r = warm.run(["--strategy", "bogus"], 60)
        assert r.returncode == 2
        assert "iotune-train: error: unknown strategy 'bogus'" in r.stderr
        ok = warm.run(train_args(tmp_path, 1), 600)         # the server goes on
        assert ok.returncode == 0 and len(parse_steps(ok.stdout)) == 1


def test_the_time_limit_kills_the_run_and_the_server_goes_on(tmp_path: Path) -> None:
    with WarmStarter() as warm:
        warm.start()
        server = warm.server.pid  # type: ignore[union-attr]
        with pytest.raises(subprocess.TimeoutExpired) as limit:
            warm.run(train_args(tmp_path, 10_000), 6)
        assert limit.value.timeout == 6                 # the limit ended it, not the 10,000 steps
        assert children(server) == []                   # killed and reaped
        ok = warm.run(train_args(tmp_path, 1), 600)
        assert ok.returncode == 0 and len(parse_steps(ok.stdout)) == 1
        assert warm.server.pid == server  # type: ignore[union-attr]  # the same server went on


def test_deepspeeds_check_of_a_fragment_in_a_fork_says_what_a_fresh_interpreter_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's last step (DeepSpeed accepts the recommended aio block)
    runs in the warm server when one is up: same verdicts, no cold start
    (no fresh interpreter is started for it)."""
    good = ds_fragment(SweepPoint(block_size=1 << 20, queue_depth=16, intra_op_parallelism=2), "/x")
    bad = json.loads(json.dumps(good))
    bad["aio"]["single_submit"] = "false"           # what ds_nvme_tune prints
    cold: list[list[str]] = []

    def counted(argv: list[str], *args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        cold.append(argv)
        return run_in_own_group(argv, *args, **kwargs)

    monkeypatch.setattr(recommend, "run_in_own_group", counted)
    with WarmStarter() as warm:
        assert validate_with_deepspeed(good, warm=warm) is None      # not started yet: a fresh interpreter
        assert not warm.running and len(cold) == 1
        warm.start()
        assert validate_with_deepspeed(good, warm=warm) is None
        warm_error = validate_with_deepspeed(bad, warm=warm)
        assert len(cold) == 1                           # both checks were forks of the server: no cold start
        with pytest.raises(ValueError, match="runs only iotune.workloads.train, iotune.sweep.ds_check, not os"):
            warm.run([], 10, module="os")
        assert children(warm.server.pid) == []  # type: ignore[union-attr]
    assert warm_error == validate_with_deepspeed(bad)
    assert "incompatible constructor arguments" in (warm_error or "")


def test_a_server_that_does_not_get_ready_is_named() -> None:
    warm = WarmStarter(ready_timeout_s=0.01)
    with pytest.raises(WarmStartUnavailable, match="the warm-start server failed: no answer"):
        warm.start()
    assert warm.server is None and warm.conn is None


def test_a_dead_server_costs_no_trial_the_executor_runs_cold(tmp_path: Path) -> None:
    ex = StepsExecutor(steps=2)
    try:
        first, _ = ex.run(SweepPoint(block_size=1 << 20, queue_depth=8), Target(tmp_path))
        assert ex.warm is not None and ex.notes == []
        os.kill(ex.warm.server.pid, signal.SIGKILL)  # type: ignore[union-attr]
        told: list[StepProgress] = []
        second, raw = ex.run(SweepPoint(block_size=1 << 20, queue_depth=8), Target(tmp_path, on_step=told.append))
    finally:
        ex.close()
    assert first.optimizer_step_s > 0 and second.optimizer_step_s > 0 and len(raw["steps"]) == 2
    # the cold run's steps reach a progress display too
    assert told == [StepProgress(0, 2)] + [StepProgress(s["step"], 2, s["step_s"], s["loss"]) for s in raw["steps"]]
    assert ex.warm is None
    assert len(ex.notes) == 1 and ex.notes[0].startswith("the warm-start server failed")
    assert ex.notes[0].endswith("training runs start cold from here on")


@needs_root
def test_a_warm_run_does_its_io_in_the_targets_cgroup(tmp_path: Path) -> None:
    """The swap writes are charged to the cgroup the run was given (the
    capped drive's), not to the server's."""
    with ext4_mount(tmp_path, 256 << 20) as mnt:
        dev = os.stat(mnt).st_dev
        number = f"{os.major(dev)}:{os.minor(dev)}"
        with blkio_cgroup("warm", [Throttle(number, write_bps=4 << 30)]) as cg, WarmStarter() as warm:
            r = warm.run(train_args(mnt, 2), 600, cgroup=cg)
            assert r.returncode == 0, r.stderr[-2000:]
            charged = {line.split()[1]: int(line.split()[2])
                       for line in (cg / "blkio.throttle.io_service_bytes").read_text().splitlines()
                       if line.startswith(number + " ")}
    # 2 steps of the tiny model swap its optimizer state (3.69 M parameters x 12 B) out at least twice
    assert charged.get("Write", 0) >= 2 * 12 * 3_688_704, charged
