"""`iotune sweep --steps-cmd ... --ds-config ...`: the user's own job as the
closed loop, read through the startup hook; and the CPU-optimizer thread
dimension (--omp-threads) on training steps."""

from __future__ import annotations

import json
import os
from dataclasses import replace
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.attribution import Attribution, PhaseSpan
from iotune.model.hook_events import completed_steps, step_timings
from iotune.model.journal import read_journal
from iotune.model.steps import parse_steps
from iotune.render.progress import clock
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.host_memory import host_memory
from iotune.model.sweep import SweepPoint
from iotune.model.sweep_result import Ranked, SweepOutcome
from iotune.render.registry import render
from iotune.sweep.config import aio_block_changes, candidate_config
from iotune.sweep.aio.threads import best_threads
from iotune.workloads.presets import PRESETS, tensor_numels
from iotune.workloads.strategies import WorkloadSpec, ds_config

from tests.conftest import ext4_mount, needs_deepspeed, needs_fio, needs_root_for

PLAIN_SCRIPT = Path(__file__).parents[1] / "data" / "plain_ds_train.py"
DEFAULT = SweepPoint()                    # DeepSpeed's aio defaults (1M, qd 8)
needs_loop_ext4 = needs_root_for("a loop device with ext4 for DeepSpeed's O_DIRECT swap files")


# ---- pure parts ---------------------------------------------------------------------------------------

def _phase(rank: int, step: int, name: str, t0_ms: int, t1_ms: int) -> PhaseSpan:
    return PhaseSpan(rank, step, name, t0_ms * 1_000_000, t1_ms * 1_000_000)


def test_step_times_from_hook_phases_slowest_rank_per_step() -> None:
    """Two ranks, gradient accumulation 2 (an "accumulate" and an "optimizer"
    step() call per step); step 2 of rank 0 never completed (killed)."""
    phases = []
    for rank, slow in ((0, 0), (1, 5)):
        for step, base in ((0, 0), (1, 100)):
            phases += [_phase(rank, step, "forward", base, base + 10),
                       _phase(rank, step, "accumulate", base + 20, base + 22),
                       _phase(rank, step, "optimizer", base + 50, base + 80 + slow)]
    phases.append(_phase(0, 2, "forward", 200, 210))
    att = Attribution(phases=tuple(phases), ranks=(0, 1))
    steps = step_timings(att)
    assert [s.step for s in steps] == [0, 1]
    assert [round(s.step_s, 9) for s in steps] == [0.085, 0.1]       # rank 1: 0 -> 85 ms, 85 -> 185 ms
    assert [round(s.optimizer_step_s, 9) for s in steps] == [0.037, 0.037]   # 2 + 35 ms on rank 1
    assert step_timings(None) == []


def test_completed_steps_counts_the_slowest_process(tmp_path: Path) -> None:
    (tmp_path / "events-1.jsonl").write_text(
        '{"k":"proc","pid":1,"rank":0}\n' + '{"k":"phase","n":"optimizer","s":0,"t0":1,"t1":2}\n' * 3)
    (tmp_path / "events-2.jsonl").write_text(
        '{"k":"proc","pid":2,"rank":1}\n{"k":"phase","n":"forward","s":0,"t0":1,"t1":2}\n'
        '{"k":"phase","n":"optimizer","s":0,"t0":1,"t1":2}\n{"k":"phase","n":"optim')
    assert completed_steps(tmp_path) == 1
    assert completed_steps(tmp_path / "none") == 0


def test_trial_config_writes_the_aio_block_and_swaps_under_the_target() -> None:
    user = ds_config(WorkloadSpec(strategy="nvme-all", nvme_path="/elsewhere", precision="bf16"))
    user["aio"] = {"use_gds": True, "num_threads": 4, "queue_depth": 99}
    point = SweepPoint(block_size=256 << 10, queue_depth=4)
    out = candidate_config(user, aio_block_changes(point.aio()), Path("/mnt/p/iotune-swap-x"))
    assert out["aio"] == {"use_gds": True, "num_threads": 4, "queue_depth": 4, "block_size": 262144,
                          "intra_op_parallelism": 1, "single_submit": False, "overlap_events": True}
    # a config without use_gds gets none written: DeepSpeed's default (false) is the user's
    del user["aio"]["use_gds"]
    assert "use_gds" not in candidate_config(user, aio_block_changes(point.aio()), None)["aio"]
    zero = out["zero_optimization"]
    assert zero["offload_optimizer"]["nvme_path"] == zero["offload_param"]["nvme_path"] == "/mnt/p/iotune-swap-x"
    assert user["zero_optimization"]["offload_param"]["nvme_path"] == "/elsewhere"     # the user's dict untouched


def _thread_row(threads: int, opt_s: float) -> Ranked:
    return Ranked(SweepPoint(omp_threads=threads), "steps", (1 / (opt_s * 2),), 0, 1 / (opt_s * 2), 0.0, 0.0, 0.0,
                  step_s=opt_s * 2, optimizer_step_s=opt_s)


def test_thread_choice_and_table() -> None:
    rows = [_thread_row(1, 0.300), _thread_row(2, 0.200)]
    assert best_threads(rows) == 2
    assert best_threads([_thread_row(1, 0.204), _thread_row(2, 0.200)]) == 1    # within 5%: fewer threads
    assert best_threads([]) == 0
    outcome = SweepOutcome("/p", "p", "fio", [], [], SweepPoint(), None, None, "", {}, None, 1, 1, 0, "j",
                           threads=rows, omp_threads_best=2)
    text = render(outcome)
    table = [line.replace("│", " ").split() for line in text.split("Number of CPU threads")[1].splitlines()[2:4]]
    assert table == [["1", "300.0", "600.0", "1"], ["2", "200.0", "400.0", "1", "use", "this"]]
    assert "Number of CPU threads" in text and "Optimizer step time, ms" in text
    assert ("CPU optimizer: OMP_NUM_THREADS=2 in the training job's environment (optimizer step 200.0 ms, "
            "1.50× faster than 1;") in text


# ---- refusals before anything runs -------------------------------------------------------------------

def _sweep(*args: str) -> object:
    return CliRunner().invoke(cli, ["sweep", *args])


def test_steps_cmd_without_placeholder_is_refused(tmp_path: Path) -> None:
    r = _sweep("--path", str(tmp_path), "--steps-cmd", "python train.py", "--ds-config", "x.json",
               "-o", str(tmp_path / "j"))
    assert r.exit_code == 2, r.output
    assert r.stderr == ("Error: --steps-cmd has no {config} placeholder: put {config} where your job takes its "
                        "DeepSpeed config, e.g. --steps-cmd \"python train.py --deepspeed_config {config}\"; "
                        "iotune writes each candidate's config to a file and puts its path there\n")
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize("args, message", [
    (["--steps-cmd", f"{sys.executable} t.py {{config}}", "--ds-config", "missing.json"],
     "missing.json does not exist: give your DeepSpeed config JSON"),
    (["--steps-cmd", f"{sys.executable} t.py {{config}}"], "--steps-cmd needs --ds-config FILE"),
    (["--ds-config", "x.json"], "--ds-config is the DeepSpeed config of --steps-cmd's job: give --steps-cmd too"),
    (["--omp-threads", "1,2", "--confirm", "0"],
     "CPU-optimizer threads (--omp-threads, or omp_threads in the profile) is measured on training steps, "
     "and this sweep runs none (--confirm 0 / confirm_top = 0 in profile default): give --confirm 1 or more"),
    (["--executor", "aio", "--engines", "io_uring"],
     "--engines io_uring: the aio executor measures DeepSpeed's own engine, which is libaio only"),
])
def test_bad_steps_input_is_refused(tmp_path: Path, args: list[str], message: str) -> None:
    r = _sweep("--path", str(tmp_path), "-o", str(tmp_path / "j"), *args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"Error: {message}"), r.stderr
    assert not (tmp_path / "j").exists()


def test_ds_config_without_nvme_offload_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "cpu.json"
    cfg.write_text(json.dumps(ds_config(WorkloadSpec(strategy="cpu"))))
    r = _sweep("--path", str(tmp_path), "--steps-cmd", f"{sys.executable} t.py {{config}}", "--ds-config", str(cfg))
    assert r.exit_code == 2
    assert r.stderr.startswith(f"Error: {cfg} offloads nothing to NVMe, so aio settings cannot change its steps")


# ---- end to end ---------------------------------------------------------------------------------------

@pytest.fixture
def ext4_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 512 MiB ext4 loop drive (DeepSpeed swaps with O_DIRECT)."""
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("needs mkfs.ext4 (e2fsprogs)")
    with ext4_mount(tmp_path, 512 << 20) as mnt:
        yield mnt


def _profile(tmp_path: Path, block_sizes: str = '"256K", "1M"', steps: int = 3) -> Path:
    """Two points, so one candidate besides DeepSpeed's defaults (1M) is
    confirmed against them, in one pair (replay_pairs 0: on real steps
    directly; the ranking on the replay is tests/sweep/test_aio_replay.py's)."""
    path = tmp_path / "p.toml"
    path.write_text(f'[space]\nblock_size = [{block_sizes}]\nqueue_depth = [8]\nintra_op_parallelism = [1]\n'
                    f'single_submit = [false]\noverlap_events = [true]\n[run]\nsearch = "grid"\nrepeats = 1\n'
                    f'file_bytes = "4M"\nconfirm_top = 1\nconfirm_pairs = 1\nsteps = {steps}\nreplay_pairs = 0\n')
    return path


CANDIDATE = SweepPoint(block_size=256 << 10)      # the profile's one point besides the defaults


def _user_config(tmp_path: Path, **overrides: object) -> Path:
    cfg = ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path=str(tmp_path / "my-own-swap")))
    cfg.update(overrides)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    return path


def _run_sweep(mnt: Path, tmp_path: Path, command: str, cfg: Path, *extra: str, profile: Path | None = None):
    out = tmp_path / "journal"
    r = CliRunner().invoke(cli, ["sweep", "--path", str(mnt), "--profile", str(profile or _profile(tmp_path)),
                                 "--steps-cmd", command, "--ds-config", str(cfg), "-o", str(out), "--json", *extra])
    return r, read_journal(out / "journal.jsonl")


@needs_loop_ext4
@needs_fio
@needs_deepspeed
def test_user_command_loop_on_the_builtin_script_with_threads(ext4_dir: Path, tmp_path: Path) -> None:
    """The built-in script run as a user command (its own --steps 50, stopped
    by the hook after 3), at DeepSpeed's defaults, then at 2 CPU threads."""
    cfg = _user_config(tmp_path)
    command = f"{sys.executable} -W ignore -m iotune.workloads.train --steps 50 --ds-config {{config}}"
    r, journal = _run_sweep(ext4_dir, tmp_path, command, cfg, "--omp-threads", "2")
    assert r.exit_code == 0, r.stderr[-3000:]
    assert (f"sweep: nvme_path {tmp_path / 'my-own-swap'} in {cfg}: each trial's config copy swaps to a fresh "
            f"directory {ext4_dir}/iotune-swap-* instead, since the sweep tunes the drive at --path") in r.stderr
    assert journal.env is not None and journal.env.steps_cmd["argv"][-1] == "{config}"
    trials = [t for t in journal.trials if t.executor == "cmd"]
    doc = json.loads(r.stdout)
    chosen = SweepPoint.from_json(doc["recommended"])
    # one (candidate, defaults) pair, then the recommendation at 2 CPU threads
    assert [t.point.key() for t in trials] == [CANDIDATE.key(), DEFAULT.key(),
                                               replace(chosen, omp_threads=2).key()]
    assert not [t for t in journal.trials if t.executor == "steps"]        # no built-in-workload trials
    cmd = {t.point.omp_threads: t for t in trials}
    # the swap buffers the hook saw locked are the offload model's, to the byte (one sub-group: the aio block
    # does not change them)
    locked = host_memory(OffloadKnobs.from_ds_config(json.loads(cfg.read_text())),
                         JobShape(tuple(tensor_numels(PRESETS["tiny"])))).locked_bytes
    for threads, t in [(t.point.omp_threads, t) for t in trials]:
        assert t.status == "ok", t.error
        assert t.raw["memory"]["locked_bytes"] == locked < t.raw["memory"]["rss_bytes"], t.raw["memory"]
        assert (t.raw["returncode"], t.raw["ended_by"], len(t.raw["steps"])) == (0, "", 3)   # stopped after 3
        assert t.raw["swap_bytes"]["write"] > 0 and t.raw["swap_bytes"]["read"] > 0
        if threads:
            assert t.raw["omp_threads_seen"] == [str(threads)]
        # the hook's optimizer-step times agree with the script's own (its step k+1 is the hook's step k)
        own = {s.step: s for s in parse_steps(t.raw["stdout_tail"])}
        for hooked in t.raw["steps"][:2]:
            assert abs(hooked["optimizer_step_s"] - own[hooked["step"] + 1].optimizer_step_s) < 0.005
    assert list(ext4_dir.glob("iotune-swap-*")) == []                   # swap files removed after every trial
    assert {c["executor"] for c in doc["confirmed"]} == {"cmd"} and doc["confirm_error"] == ""
    [row] = doc["threads"]
    assert (row["omp_threads"], row["executor"], doc["omp_threads_best"]) == (2, "cmd", 2)
    assert row["optimizer_step_s"] == cmd[2].measurement.optimizer_step_s


@needs_loop_ext4
@needs_fio
@needs_deepspeed
def test_user_command_loop_on_a_plain_deepspeed_script(ext4_dir: Path, tmp_path: Path) -> None:
    """A script iotune did not write: each candidate's aio block reaches it,
    and the hook stops it after 3 of its 1000 steps."""
    cfg = _user_config(tmp_path, gradient_accumulation_steps=2, train_micro_batch_size_per_gpu=8)
    r, journal = _run_sweep(ext4_dir, tmp_path, f"{sys.executable} -W ignore {PLAIN_SCRIPT} --deepspeed_config "
                            f"{{config}}", cfg)
    assert r.exit_code == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    expected = {CANDIDATE.key(), DEFAULT.key()}                        # one pair
    cmd = [t for t in journal.trials if t.executor == "cmd"]
    assert {t.point.key() for t in cmd} == expected and len(cmd) == len(expected)
    # the progress on stderr (not a terminal): one plain line per trial, none of the job's own output
    m = [t.measurement for t in cmd]
    assert [line for line in r.stderr.splitlines() if line.startswith("[") and " cmd " in line] == [
        f"[1/2] cmd bs=256 KiB qd=8 t=1 rep 0: step {m[0].step_s:.3f} s, optimizer {m[0].optimizer_step_s:.3f} s "
        f"(ETA {clock(cmd[0].seconds)})",
        f"[2/2] cmd bs=1 MiB qd=8 t=1 rep 0: step {m[1].step_s:.3f} s, optimizer {m[1].optimizer_step_s:.3f} s"]
    assert "step 2 loss" not in r.stderr and "[WARNING]" not in r.stderr
    for t in cmd:
        assert t.status == "ok", t.error
        assert len(t.raw["steps"]) == 3 and "step 2 loss" not in t.raw["stdout_tail"]
        assert f'"block_size": {t.point.block_size}' in t.raw["stdout_tail"]       # its own aio block
        assert 0 < t.measurement.optimizer_step_s < t.measurement.step_s
    assert {c["key"] for c in doc["confirmed"]} == expected
    assert doc["step_gain"]["verdict"] == "undecided"                 # one pair: no noise estimate, never faster
    assert doc["recommended"] == DEFAULT.to_json() and doc["threads"] == []
    assert list(ext4_dir.glob("iotune-swap-*")) == []


@needs_loop_ext4
@needs_fio
@needs_deepspeed
@pytest.mark.parametrize("command, error", [
    (f"{sys.executable} -c \"import sys; sys.stderr.write('boom\\n'); sys.exit(3)\" {{config}}",
     "your command failed (exit 3): boom"),
    (f"{sys.executable} -c pass {{config}}", "no optimizer step was seen: is it a DeepSpeed job? "),
])
def test_a_failing_user_command_is_a_failed_trial(ext4_dir: Path, tmp_path: Path, command: str,
                                                  error: str) -> None:
    r, journal = _run_sweep(ext4_dir, tmp_path, command, _user_config(tmp_path))
    assert r.exit_code == 1, r.output
    fio = [t for t in journal.trials if t.executor == "fio"]
    cmd = [t for t in journal.trials if t.executor == "cmd"]        # the candidate, then the defaults
    assert [t.status for t in fio] == ["ok", "ok"] and [t.point.key() for t in cmd] == [CANDIDATE.key(),
                                                                                       DEFAULT.key()]
    assert all(t.status == "failed" and t.error.startswith(error) for t in cmd), [t.error for t in cmd]
    doc = json.loads(r.stdout)
    assert doc["confirm_error"] == f"every training-step trial failed (cmd); the first: {cmd[0].error}"
    assert doc["failed"] == 2 and doc["threads"] == []
    assert list(ext4_dir.glob("iotune-swap-*")) == []


@needs_loop_ext4
@needs_fio
@needs_deepspeed
def test_thread_table_on_the_builtin_workload(ext4_dir: Path, tmp_path: Path) -> None:
    """No --steps-cmd: the built-in workload's steps at 1 and 2 CPU threads."""
    out = tmp_path / "journal"
    r = CliRunner().invoke(cli, ["sweep", "--path", str(ext4_dir), "--profile", str(_profile(tmp_path, steps=2)),
                                 "--omp-threads", "1,2", "-o", str(out)])
    assert r.exit_code == 0, r.stderr[-3000:]
    steps = {t.point.omp_threads: t for t in read_journal(out / "journal.jsonl").trials if t.executor == "steps"}
    assert sorted(steps) == [0, 1, 2] and all(t.status == "ok" for t in steps.values())
    table = r.stdout.split("Number of CPU threads")[1].split("\n\n")[0].splitlines()[2:]   # after the rule
    rows = [line.replace("│", " ").split() for line in table]
    assert [row[0] for row in rows] == ["1", "2"], r.stdout
    for row, threads in zip(rows, (1, 2)):
        assert float(row[1]) == round(1000 * steps[threads].measurement.optimizer_step_s, 1)
    assert "CPU-optimizer threads (built-in nvme-opt workload; medians)" in r.stdout
    assert "CPU optimizer: OMP_NUM_THREADS=" in r.stdout


def test_builtin_script_takes_a_ds_config_and_refuses_contradicting_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The built-in workload's command line, run in this process: it decides
    both before it imports DeepSpeed."""
    from iotune.workloads.train import main

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(ds_config(WorkloadSpec(strategy="cpu", micro_batch=2))))
    base = ["--ds-config", str(cfg)]
    assert main([*base, "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(cfg.read_text())
    assert main([*base, "--strategy", "cpu", "--aio-queue-depth", "4"]) == 2
    assert capsys.readouterr().err == (f"iotune-train: error: --strategy, --aio-queue-depth cannot be combined with "
                                       f"--ds-config: the config file decides them; edit {cfg} instead\n")


def test_each_step_the_hook_reports_is_told_with_its_time(tmp_path: Path) -> None:
    """A job whose hook reports 3 steps (forward 0-100 ms, optimizer 200-500
    ms, a second apart): told that it started, then steps 1-3 of 3 with the
    slowest rank's step times (0.5 s from its first phase, then 1 s each),
    no loss (the hook does not see it)."""
    from iotune.model.steps import StepProgress
    from iotune.sweep.user_job import run_job

    events = tmp_path / "events"
    events.mkdir()
    ms = 1_000_000
    lines = ['{"k":"proc","pid":1,"rank":0}'] + [
        json.dumps({"k": "phase", "n": name, "s": step, "t0": (1000 * step + t0) * ms, "t1": (1000 * step + t1) * ms})
        for step in range(3) for name, t0, t1 in (("forward", 0, 100), ("optimizer", 200, 500))]
    code = f"open({str(events / 'events-1.jsonl')!r}, 'w').write({chr(10).join(lines) + chr(10)!r})"
    told: list[StepProgress] = []
    job = run_job([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, None, 30, tmp_path, events, 3,
                  on_step=told.append)
    assert job.returncode == 0, job.stderr
    assert told == [StepProgress(0, 3), StepProgress(1, 3, 0.5), StepProgress(2, 3, 1.0), StepProgress(3, 3, 1.0)]


def _alive(marker: str) -> list[int]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                out.append(int(cmdline.parent.name))
        except OSError:
            continue
    return out


def test_time_limit_kills_what_left_the_process_group(tmp_path: Path) -> None:
    """A job whose child moved to a process group of its own (as ninja's
    compilers do during a DeepSpeed op build) is killed whole at the limit."""
    from iotune.sweep.user_job import run_job

    marker = "3171.5"
    events = tmp_path / "events"
    events.mkdir()
    code = (f"import subprocess, sys; p = subprocess.Popen(['sleep', '{marker}'], process_group=0); "
            f"sys.stderr.write('started\\n'); sys.stderr.flush(); p.wait()")
    job = run_job([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, None, 1.5, tmp_path, events, 3)
    assert (job.ended_by, job.stderr) == ("time limit", "started\n")
    assert _alive(f"sleep\0{marker}") == []


def test_a_crash_in_shutdown_after_every_step_still_counts(tmp_path: Path) -> None:
    """DeepSpeed's aio threads can abort the interpreter's exit after the hook
    ended the job ("terminate called without an active exception", exit -6):
    the steps were measured, so the trial counts and keeps the exit; a crash
    before the last step is a failed trial."""
    from iotune.model.hook_events import StepTiming
    from iotune.sweep.user_job import JobRun, UserJob, _check
    from iotune.sweep.executor import TrialFailed

    swap = tmp_path / "swap"
    (swap / "zero_stage_3").mkdir(parents=True)
    (swap / "zero_stage_3" / "x.swp").touch()
    job = UserJob(argv=("train", "{config}"), config_path=tmp_path / "ds.json", steps=3)
    steps = [StepTiming(step=i, step_s=1.0, optimizer_step_s=0.5) for i in range(3)]
    abort = JobRun(-6, 9.0, "", "", "terminate called without an active exception\n")
    raw: dict = {}
    _check(job, SweepPoint(), abort, steps, [], swap, raw)
    assert raw["shutdown"] == "exit -6 after its 3 steps: terminate called without an active exception"
    with pytest.raises(TrialFailed, match=r"^your command failed \(exit -6\): terminate called without"):
        _check(job, SweepPoint(), abort, steps[:2], [], swap, {})


def test_a_build_stopped_by_the_time_limit_leaves_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that plays DeepSpeed's first op load as torch does it (take
    <ext>/async_io/lock, run the compiler in the op's directory in a process
    group of its own) is stopped at the limit: its lock is removed and
    named; an older lock of someone else's is left for the user."""
    from iotune.sweep.user_job import UserJob, _check, run_job
    from iotune.sweep.executor import TrialFailed

    ext = tmp_path / "ext"
    (ext / "cpu_adam").mkdir(parents=True)
    older = ext / "cpu_adam" / "lock"
    older.touch()
    os.utime(older, (1, 1))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    code = (f"import os, subprocess, sys; d = {str(ext / 'async_io')!r}; os.makedirs(d); "
            f"os.close(os.open(d + '/lock', os.O_CREAT | os.O_EXCL)); "
            f"p = subprocess.Popen(['sleep', '3172.5'], cwd=d, process_group=0); p.wait()")
    events = tmp_path / "events"
    events.mkdir()
    run = run_job([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, None, 1.5, tmp_path, events, 3)
    assert run.ended_by == "time limit" and (ext / "async_io" / "lock").exists()
    job = UserJob(argv=("train", "{config}"), config_path=tmp_path / "ds.json", steps=3)
    with pytest.raises(TrialFailed) as e:
        _check(job, SweepPoint(), run, [], [], tmp_path, {})
    assert f"the time limit stopped a DeepSpeed op build, whose lock was removed: {ext / 'async_io' / 'lock'}" \
        in str(e.value)
    assert not (ext / "async_io" / "lock").exists() and older.exists()
    assert f"DeepSpeed op build lock(s) exist: {older}" in str(e.value)
