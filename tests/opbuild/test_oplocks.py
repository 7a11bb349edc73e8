"""DeepSpeed op-build locks that would hang a job (issue 21): torch's FileBaton
lock left by a killed build is found while `iotune trace` runs a job that
really loads DeepSpeed's async_io op through torch's JIT loader, and while
a sweep's trial runs; `iotune trace` refuses a Python job on a stale one.

Every job here loads the op with TORCH_EXTENSIONS_DIR=<tmp>/ext, so the lock
at <tmp>/ext/async_io/lock is the one torch's loader waits on; none of them
ever builds the op (the lock is there first), and each is ended by the test."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.opbuild import oplocks
from iotune.cli import cli
from iotune.model.journal import read_journal
from iotune.model.sweep import SweepPoint, Trial
from iotune.sweep.journal import Journal
from iotune.workloads.strategies import WorkloadSpec, ds_config

from tests.conftest import needs_bpf, needs_deepspeed, needs_fio

JOB = Path(__file__).parents[1] / "data" / "jit_load_op.py"
IOTUNE = [sys.executable, "-m", "iotune"]
MESSAGE_WITHIN_S = 30.0      # from starting `iotune trace` (bcc compiles its probe first: ~3 s here)


def plant_lock(root: Path, op: str, age_s: float = 0.0) -> Path:
    lock = root / op / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    if age_s:
        then = time.time() - age_s
        os.utime(lock, (then, then))
    return lock


def note_pattern(lock: Path, op: str, context: str) -> re.Pattern[str]:
    """The exact message for `lock`, its elapsed seconds (written {N} in `context`) any number."""
    found = oplocks.BuildLock(str(lock), 0.0, ())
    text = re.escape(oplocks.hang_note(found, context.replace("{N}", "\0"))).replace("\0", r"\d+")
    assert f"`rm {lock}`" in text.replace("\\", "") and op in text
    return re.compile(text)


@pytest.fixture
def baton_holder(tmp_path: Path) -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    """Starts a process that takes torch's FileBaton on a path (as torch's
    loader does before it builds), returned once it holds it."""
    started: list[subprocess.Popen[str]] = []

    def hold(lock: Path) -> subprocess.Popen[str]:
        lock.parent.mkdir(parents=True, exist_ok=True)
        code = ("import sys; from torch.utils.file_baton import FileBaton; b = FileBaton(sys.argv[1]); "
                "print('held' if b.try_acquire() else 'busy', flush=True); sys.stdin.read()")
        p = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline() == "held\n"
        return p

    yield hold
    for p in started:
        p.kill()
        p.wait()


def builder_in(directory: Path) -> subprocess.Popen[bytes]:
    """A process working in the op's directory, as ninja and its compilers do during a build."""
    return subprocess.Popen(["sleep", "3173.5"], cwd=directory)


# ---- finding who holds a lock, and the watch (real processes, clock given) -------------------------------

@needs_deepspeed
def test_a_filebaton_lock_is_held_until_its_builder_is_killed(tmp_path: Path, baton_holder) -> None:
    lock = tmp_path / "ext" / "async_io" / "lock"
    holder = baton_holder(lock)
    then = time.time() - 3600
    os.utime(lock, (then, then))                    # old, but held: a long build, not a left-over
    [found] = oplocks.build_locks([tmp_path / "ext"])
    assert (found.holders, found.builders, found.orphaned, found.stale) == ((holder.pid,), (), False, False)
    watch = oplocks.LockWatch({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert [watch.poll(t) for t in (0.0, 1.0, 2.0)] == [[], [], []]
    holder.kill()
    holder.wait()
    assert lock.exists()                            # the killed build's lock stays: FileBaton never removed it
    [found] = oplocks.build_locks([tmp_path / "ext"])
    assert (found.holders, found.orphaned, found.stale) == ((), True, True)
    assert watch.poll(3.0) == [] and watch.poll(3.5) == []        # seen once, then only 0.5 s later
    assert [lk.path for lk in watch.poll(4.0)] == [str(lock)]     # twice, 1 s apart
    assert watch.poll(5.0) == []                                  # said once


def test_a_lock_with_a_process_building_under_it_is_not_reported(tmp_path: Path) -> None:
    lock = plant_lock(tmp_path / "ext", "async_io")
    builder = builder_in(lock.parent)
    watch = oplocks.LockWatch({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    try:
        assert [watch.poll(t) for t in (0.0, 1.0, 2.0, 3.0)] == [[], [], [], []]
        assert oplocks.build_locks([tmp_path / "ext"])[0].builders == (builder.pid,)
    finally:
        builder.kill()
        builder.wait()
    assert watch.poll(4.0) == []
    assert [lk.path for lk in watch.poll(5.0)] == [str(lock)]


def test_a_new_lock_at_the_same_path_is_watched_afresh(tmp_path: Path) -> None:
    """A lock removed and made again (another load took the baton) is another lock: its settle time restarts."""
    lock = plant_lock(tmp_path / "ext", "cpu_adam", age_s=60)
    watch = oplocks.LockWatch({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert watch.poll(0.0) == []
    lock.unlink()
    plant_lock(tmp_path / "ext", "cpu_adam", age_s=30)
    assert watch.poll(1.0) == [] and watch.poll(1.5) == []
    assert [lk.op for lk in watch.poll(2.0)] == ["cpu_adam"]


def test_a_trial_a_lock_stopped_is_run_again_on_resume(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    point = SweepPoint()
    journal.record(Trial("cmd", point, 0, "failed", None, "waits on the lock", "2026-11-25T23:00:00+00:00", 2.0,
                         {"build_lock": "/x/async_io/lock"}))
    assert journal.done("cmd", point.key(), 0) is None
    journal.record(Trial("cmd", point, 0, "failed", None, "exit 1", "2026-11-25T23:01:00+00:00", 2.0, {}))
    assert Journal(tmp_path / "journal.jsonl").done("cmd", point.key(), 0).error == "exit 1"


# ---- iotune trace ---------------------------------------------------------------------------------------

class Lines:
    """A process's stderr, line by line as it comes (a reader thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen, self.pending = proc, [], []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, want: Callable[[str], bool], deadline: float, what: str) -> str:
        """The first line wanted that no earlier wait took, whether it came
        before this call or comes by the deadline: the job's own lines and
        iotune's may arrive in either order."""
        for i, line in enumerate(self.pending):
            if want(line):
                return self.pending.pop(i)
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                pytest.fail(f"no {what} by the deadline; stderr so far:\n" + "\n".join(self.seen))
            self.seen.append(line)
            if want(line):
                return line
            self.pending.append(line)


def start_trace(tmp_path: Path, *job_args: str, trace_args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), PYTHONWARNINGS="ignore")
    return subprocess.Popen([*IOTUNE, "trace", "--no-save", "-d", "vda", *trace_args, "--", sys.executable, str(JOB),
                             *job_args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)


def end(proc: subprocess.Popen[str], ext: Path) -> None:
    """SIGTERM to iotune (it passes it to the job's process group); then nothing may be left building in ext."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    finally:
        proc.kill()
        for pid in oplocks.pids_in(ext):
            os.kill(pid, signal.SIGKILL)


TRACED = "The traced job has not completed a training step after {N} s: if it loads {op}, it is waiting on this lock."


@needs_bpf
@needs_deepspeed
def test_trace_names_a_lock_the_job_waits_on_within_seconds(tmp_path: Path) -> None:
    """(a) The lock is there before the job starts (a few seconds old: not yet stale, so the job is started)."""
    lock = plant_lock(tmp_path / "ext", "async_io", age_s=5)
    t0 = time.monotonic()
    proc = start_trace(tmp_path)
    lines = Lines(proc)
    try:
        said = lines.wait_for(lambda s: s.startswith("iotune: "), t0 + MESSAGE_WITHIN_S, "message about the lock")
        traced = TRACED.replace("{op}", "async_io")
        assert note_pattern(lock, "async_io", traced).fullmatch(said[len("iotune: "):]), said
        lines.wait_for(lambda s: s == "loading async_io", t0 + 120, "job loading the op")
        # the job really waits in torch's FileBaton: removing the lock lets it take the baton and build
        lock.unlink()
        deadline = time.monotonic() + 60
        while not [lk for lk in oplocks.build_locks([tmp_path / "ext"]) if lk.holders]:
            assert time.monotonic() < deadline and proc.poll() is None, "the job never took the lock"
            time.sleep(0.05)
        assert sum(s.startswith("iotune: ") for s in lines.seen) == 1      # said once
    finally:
        end(proc, tmp_path / "ext")


@needs_bpf
@needs_deepspeed
def test_without_the_hook_a_lock_is_named_once_the_command_has_run_10_s(tmp_path: Path) -> None:
    """--no-inject: no training step can be seen, so a lock is named once the command has run 10 s."""
    lock = plant_lock(tmp_path / "ext", "async_io", age_s=5)
    t0 = time.monotonic()
    proc = start_trace(tmp_path, trace_args=("--no-inject",))
    lines = Lines(proc)
    try:
        said = lines.wait_for(lambda s: s.startswith("iotune: "), t0 + MESSAGE_WITHIN_S + 10, "message about the lock")
        context = "The traced command has run {N} s: if it loads async_io, it is waiting on this lock."
        assert note_pattern(lock, "async_io", context).fullmatch(said[len("iotune: "):]), said
        assert int(said.split("has run ")[1].split(" s:")[0]) >= 10 and time.monotonic() - t0 >= 10
    finally:
        end(proc, tmp_path / "ext")


@needs_bpf
@needs_deepspeed
def test_trace_names_a_lock_a_build_killed_during_the_run_left(tmp_path: Path, baton_holder) -> None:
    """(b) A build holds the lock when the job starts; it is killed mid-run, then the job loads the op."""
    lock = tmp_path / "ext" / "async_io" / "lock"
    holder = baton_holder(lock)
    go = tmp_path / "go"
    t0 = time.monotonic()
    proc = start_trace(tmp_path, "--after", str(go))
    lines = Lines(proc)
    try:
        lines.wait_for(lambda s: s == "waiting for the signal", t0 + 120, "job waiting for its signal")
        holder.kill()                       # the build dies and leaves its lock
        holder.wait()
        killed = time.monotonic()
        go.touch()
        said = lines.wait_for(lambda s: s.startswith("iotune: "), killed + 10, "message about the lock")
        assert note_pattern(lock, "async_io", TRACED.replace("{op}", "async_io")).fullmatch(said[len("iotune: "):])
        assert lock.exists()
    finally:
        end(proc, tmp_path / "ext")


@needs_bpf
@needs_deepspeed
def test_trace_does_not_name_a_lock_a_build_is_working_under(tmp_path: Path) -> None:
    """(c) async_io's lock has a builder; cpu_adam's lock has none. The watch looks at both in the same polls
    (async_io's first), so when cpu_adam's is named, async_io's was seen just as long and was not; once its
    builder is gone, it is named too."""
    lock = plant_lock(tmp_path / "ext", "async_io", age_s=5)
    orphan = plant_lock(tmp_path / "ext", "cpu_adam", age_s=5)
    builder = builder_in(lock.parent)
    t0 = time.monotonic()
    proc = start_trace(tmp_path)
    lines = Lines(proc)
    try:
        lines.wait_for(lambda s: str(orphan) in s, t0 + MESSAGE_WITHIN_S, "message about cpu_adam's lock")
        assert not [s for s in lines.seen if str(lock) in s]
        builder.kill()
        builder.wait()
        said = lines.wait_for(lambda s: s.startswith("iotune: "), time.monotonic() + 10, "message about async_io's")
        assert note_pattern(lock, "async_io", TRACED.replace("{op}", "async_io")).fullmatch(said[len("iotune: "):])
    finally:
        builder.kill()
        builder.wait()
        end(proc, tmp_path / "ext")


def test_trace_refuses_a_python_job_on_a_stale_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(e) Before anything is attached or started: exit 2, the lock and its fix named."""
    lock = plant_lock(tmp_path / "ext", "async_io", age_s=20 * 60)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    ran = tmp_path / "ran"
    r = CliRunner().invoke(cli, ["trace", "--no-save", "--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert r.stderr == (f"Error: DeepSpeed op build lock {lock} is 20 min old and no build is running: a build killed "
                        f"midway left it, and every load of async_io would wait on it forever. Remove it (`rm {lock}`,"
                        f" or `iotune doctor --ds-config CONFIG --fix`) and run again; `iotune trace` does not start "
                        f"a Python job that would wait on it\n")
    assert not ran.exists()
    # a multi-node trace's command (a launcher) runs here too: refused before any host is reached
    r = CliRunner().invoke(cli, ["trace", "--hosts", "node-a,node-b", "--", "deepspeed", "train.py"])
    assert r.exit_code == 2 and f"(`rm {lock}`, or `iotune doctor --ds-config CONFIG --fix`)" in r.stderr, r.output


def test_which_commands_are_python_jobs(tmp_path: Path) -> None:
    from iotune.trace.lockwatch import runs_python

    script, shell = tmp_path / "train", tmp_path / "run.sh"
    script.write_text("#!/usr/bin/env python3\nimport deepspeed\n")
    shell.write_text("#!/bin/sh\ndeepspeed train.py\n")
    env = {"PATH": "/usr/bin:/bin"}
    assert [runs_python(argv, env) for argv in (["python3.11", "t.py"], ["/x/bin/deepspeed", "t.py"],
                                                ["torchrun", "t.py"], [str(script)], [str(shell)], ["fio"],
                                                [str(tmp_path / "missing")], [])] == \
        [True, True, True, True, False, False, False, False]


@needs_bpf
def test_trace_warns_about_a_stale_lock_and_runs_any_other_command(tmp_path: Path) -> None:
    lock = plant_lock(tmp_path / "ext", "async_io", age_s=20 * 60)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    r = subprocess.run([*IOTUNE, "trace", "--no-save", "-d", "vda", "--", "sh", "-c", "echo ran >&2"],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"iotune: warning: DeepSpeed op build lock {lock} is 20 min old and no build is "
                               f"running: ")
    assert r.stderr.count(str(lock)) == 2 and "\nran\n" in r.stderr      # named once (its path twice), and run


# ---- the sweep ------------------------------------------------------------------------------------------

@needs_fio
@needs_deepspeed
def test_a_sweep_trial_waiting_on_a_lock_fails_early_and_stops_the_sweep(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """(d) fio's two points run, then the user command's trial loads async_io through torch's JIT loader and
    waits on the lock: it fails within seconds (its time limit is 60 s), journaled with the lock, and the
    sweep stops naming the fix."""
    lock = plant_lock(tmp_path / "ext", "async_io", age_s=5)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    target = tmp_path / "drive"
    target.mkdir()
    profile = tmp_path / "p.toml"
    profile.write_text('[space]\nblock_size = ["256K", "1M"]\nqueue_depth = [8]\nintra_op_parallelism = [1]\n'
                       'single_submit = [false]\noverlap_events = [true]\n[run]\nsearch = "grid"\nrepeats = 1\n'
                       'file_bytes = "4M"\nconfirm_top = 1\nconfirm_pairs = 1\nsteps = 3\n')
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps(ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path=str(target)))))
    out = tmp_path / "journal"
    command = f"{sys.executable} -W ignore {JOB} --config {{config}}"
    r = CliRunner().invoke(cli, ["sweep", "--path", str(target), "--profile", str(profile), "--steps-cmd", command,
                                 "--ds-config", str(cfg), "--steps-timeout", "60", "-o", str(out), "--json"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    trials = read_journal(out / "journal.jsonl").trials
    assert [(t.executor, t.status) for t in trials] == [("fio", "ok"), ("fio", "ok"), ("cmd", "failed")]
    failed = trials[-1]
    context = (f"The trial's job ({sys.executable}) had not completed a training step after {{N}} s: it waits on "
               f"this lock, as would every later trial.")
    assert note_pattern(lock, "async_io", context).fullmatch(failed.error), failed.error
    assert failed.raw["build_lock"] == str(lock) and failed.seconds < 60
    assert r.stderr.endswith(f"Error: sweep stopped: {failed.error}; every finished trial is in the journal "
                             f"{out / 'journal.jsonl'}: run the same command again to resume\n")
    assert oplocks.pids_in(tmp_path / "ext") == [] and lock.exists()     # the job is gone; the lock is the user's


# ---- iotune doctor's finding ------------------------------------------------------------------------------

@needs_deepspeed
def test_doctor_says_what_a_lock_is_and_who_holds_it(tmp_path: Path, baton_holder) -> None:
    from iotune.doctor.job import check_lock

    ext = tmp_path / "ext"
    stale = plant_lock(ext, "async_io", age_s=3600)
    young = plant_lock(ext, "cpu_adam", age_s=120)
    holder = baton_holder(ext / "fused_adam" / "lock")
    checks = {lk.op: check_lock(lk) for lk in oplocks.build_locks([ext])}
    what = ("torch creates this lock while it compiles DeepSpeed's {op} op on first use and removes it when the "
            "build ends; ")
    assert (checks["async_io"].status, checks["async_io"].fix, checks["async_io"].fixable) == \
        ("fail", f"rm {stale}", True)
    assert checks["async_io"].detail == (f"{stale}: 60 min old, no build running: {what.format(op='async_io')}a "
                                         f"killed build left it, and every load of async_io waits on it forever, "
                                         f"silently")
    assert (checks["cpu_adam"].status, checks["cpu_adam"].fixable) == ("warn", False)
    assert checks["cpu_adam"].detail == (f"{young}: 2 min old, no process here holds it or builds under it: "
                                         f"{what.format(op='cpu_adam')}a build killed midway leaves it, and every "
                                         f"load of cpu_adam then waits on it forever, silently (or a build on "
                                         f"another machine sharing this directory holds it)")
    assert checks["cpu_adam"].fix == (f"rm {young} if no build elsewhere shares this directory "
                                      f"(after 10 min, --fix does)")
    assert checks["fused_adam"].status == "warn"
    assert checks["fused_adam"].detail.startswith(f"{ext / 'fused_adam' / 'lock'}: 0 min old, held by pid "
                                                  f"{holder.pid} ({sys.executable} -c ")


@needs_deepspeed
def test_the_builtin_workloads_trial_and_the_deepspeed_check_stop_on_a_lock(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in workload's steps run as a fork of the warm-start server (which leaves a locked op
    alone), whose run then loads async_io through DeepSpeed and waits; the recommendation's DeepSpeed
    check in a fresh interpreter likewise: both end within seconds, naming the lock."""
    from iotune.sweep.executor import Target, TrialFailed
    from iotune.sweep.aio.recommend import validate_with_deepspeed
    from iotune.sweep.aio.steps_executor import StepsExecutor

    lock = plant_lock(tmp_path / "ext", "async_io", age_s=5)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    executor = StepsExecutor(steps=2, timeout_s=120)
    try:
        executor.warm.start()                  # type: ignore[union-attr]   (its warm-up is not a trial)
        t0 = time.monotonic()
        with pytest.raises(TrialFailed) as e:
            executor.run(SweepPoint(), Target(tmp_path))
        took_s = time.monotonic() - t0
    finally:
        executor.close()
    assert e.value.stops_sweep and e.value.raw == {"build_lock": str(lock)} and took_s < 30
    assert note_pattern(lock, "async_io", "The training run had run {N} s: it waits on this lock, as would every "
                                          "later run.").fullmatch(str(e.value)), str(e.value)
    t0 = time.monotonic()
    error = validate_with_deepspeed({"aio": {"block_size": 1 << 20}}, timeout_s=120)
    assert error is not None and time.monotonic() - t0 < 30
    assert note_pattern(lock, "async_io", "The DeepSpeed check of the recommended aio block had run {N} s: it waits "
                                          "on this lock, as would every later run.").fullmatch(error), error
    assert oplocks.pids_in(tmp_path / "ext") == [] and lock.exists()
