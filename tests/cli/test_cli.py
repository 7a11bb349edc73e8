"""The command line: exit codes, exact error texts, streams."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.blockdev.devices import BlockDevice
from iotune.cli import cli
from iotune.model.runfile import load_run, save_run
from iotune.model.steps import parse_steps

from tests.conftest import needs_bpf, needs_deepspeed, needs_fio, needs_root_for, needs_tracing
from tests.trace.test_trace_cli import default_signals
from tests.records import offload_run

IOTUNE = [sys.executable, "-m", "iotune"]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_nothing_to_trace() -> None:
    r = invoke("trace")
    assert r.exit_code == 2
    assert r.stderr == ("Error: nothing to trace: give a command after `--` (iotune trace -- CMD ARGS...) "
                        "or a window with --duration S\n")


def test_command_and_duration_conflict() -> None:
    r = invoke("trace", "--duration", "1", "--", "true")
    assert r.exit_code == 2 and r.stderr == "Error: give either a command or --duration, not both\n"


def test_unknown_device() -> None:
    r = invoke("trace", "-d", "nosuchdev0", "--", "true")
    assert r.exit_code == 2
    assert r.stderr.startswith("Error: no block device 'nosuchdev0': give a name, /dev path or major:minor "
                               "(this machine has: ")
    assert r.stderr.endswith("; see `lsblk`)\n")
    assert "Traceback" not in r.output


def test_path_that_does_not_exist() -> None:
    r = invoke("trace", "--path", "/nonexistent/swap", "--", "true")
    assert r.exit_code == 2
    assert r.stderr == "Error: path '/nonexistent/swap' does not exist: give an existing file or directory\n"


def test_path_on_a_pseudo_filesystem() -> None:
    """A path with no block device is traced at the application layer
    (tests/trace/test_appio.py), but a kernel pseudo-filesystem holds no storage."""
    r = invoke("trace", "--path", "/proc/self", "--", "true")
    assert r.exit_code == 2
    assert r.stderr == ("Error: '/proc/self' is on proc (proc), a kernel pseudo-filesystem with no storage to "
                        "trace: give a path on the drive or network filesystem that holds the job's files (its "
                        "nvme_path)\n")


def test_bad_block_size() -> None:
    r = invoke("report", "x", "--block-size", "12Q")
    assert r.exit_code == 2
    assert "Invalid value for '--block-size': '12Q' is not a size: use bytes or a unit, e.g. 4096, 512K, 1MiB, 1MB" in r.stderr


def test_non_root_is_told_to_use_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("iotune.trace.kernel.effective_caps", lambda: 0)
    r = invoke("trace", "--no-save", "--", "true")
    assert r.exit_code == 1
    assert r.stderr == ("Error: tracing needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs: "
                        "run it with sudo, e.g. `sudo iotune trace -- CMD`\n")


@needs_root_for("dropping to the nobody user")
def test_really_unprivileged_process_gets_the_same_message(tmp_path: Path) -> None:
    """Not a patched check: a real process without capabilities."""
    probe = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                            sys.executable, "-c", "import iotune"], capture_output=True, cwd=tmp_path)
    if probe.returncode != 0:
        pytest.skip("needs the checkout readable by user nobody")
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *IOTUNE,
                        "trace", "--no-save", "--", "true"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("Error: tracing needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs: "
                        "run it with sudo, e.g. `sudo iotune trace -- CMD`\n")


def test_report_of_missing_run(tmp_path: Path) -> None:
    r = invoke("report", str(tmp_path / "nope"))
    assert r.exit_code == 2
    assert r.stderr == f"Error: cannot load run: {tmp_path / 'nope'} does not exist\n"


def test_report_renders_a_saved_run(tmp_path: Path) -> None:
    save_run(offload_run(), tmp_path / "run")
    r = invoke("report", str(tmp_path / "run"), "--width", "160")
    assert r.exit_code == 0
    assert "total (top-level devices: loop0): read 23 requests, 12.06 MB; written 32 requests, 15.22 MB" in r.stdout
    j = invoke("report", str(tmp_path / "run"), "--json", "--block-size", "512K")
    assert json.loads(j.stdout)["patterns"][0]["write_at_block"] == 29 and j.stderr == ""


@needs_bpf
def test_command_not_found_exits_127() -> None:
    r = invoke("trace", "--no-save", "--", "no-such-command-iotune")
    assert r.exit_code == 127
    assert r.stderr == "Error: command not found: no-such-command-iotune (check the name, or give its full path)\n"


@needs_tracing
def test_exit_status_passes_through(loop_drive: BlockDevice) -> None:
    r = invoke("trace", "--no-save", "-d", loop_drive.name, "--", "sh", "-c", "exit 7")
    assert r.exit_code == 7
    assert "exit 7 · failed" in r.stdout


@needs_tracing
def test_json_keeps_stdout_clean_and_saves(loop_drive: BlockDevice, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = subprocess.run([*IOTUNE, "trace", "--json", "-o", str(out), "-d", loop_drive.name, "--", "sh", "-c",
                        f"echo hello-from-child; dd if={loop_drive.path} of=/dev/null bs=4K count=17 iflag=direct"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["totals"]["read_requests"] == 17 and doc["totals"]["read_bytes"] == 17 * 4096
    assert "hello-from-child" in r.stderr and f"saved {out}" in r.stderr
    assert load_run(out).devices[0].direction("read").sizes == {4096: 17}


@needs_tracing
def test_sigint_mid_run_saves_what_was_collected(loop_drive: BlockDevice, tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = (f"dd if={loop_drive.path} of=/dev/null bs=4K count=13 iflag=direct; "
              f"touch {tmp_path}/ready; sleep 60")
    # default SIGINT/SIGTERM in the child even when this suite runs as a background job (SIGINT ignored)
    p = subprocess.Popen([*IOTUNE, "trace", "-o", str(out), "-d", loop_drive.name, "--", "sh", "-c", script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.stderr else ""
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)    # to iotune only, as `kill -INT` would
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 130, stderr         # sh died of the forwarded SIGINT
    run = load_run(out)
    assert run.outcome == "interrupted" and run.exit_status == 130
    assert run.devices[0].direction("read").sizes == {4096: 13}
    assert "interrupted" in stdout


@needs_tracing
def test_duration_window(loop_drive: BlockDevice) -> None:
    r = invoke("trace", "--no-save", "--json", "-d", loop_drive.name, "--duration", "0.3")
    assert r.exit_code == 0
    run = json.loads(r.stdout)["run"]
    assert run["outcome"] == "window" and run["command"] == [] and run["exit_status"] is None
    assert run["duration_s"] >= 0.3


@needs_fio
@needs_tracing
def test_demo_traces_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fio demo on a drive capped at 200 MB/s: the cap is a real blkio
    cgroup that the traced fio runs in, and it is gone afterwards, with the
    image, the mount and the loop device."""
    import contextlib

    import iotune.volumes.scratch as scratch

    made = []
    real = scratch.blkio_cgroup

    @contextlib.contextmanager
    def spy(name_hint, limits):
        with real(name_hint, limits) as cg:
            made.append((cg, list(limits), (cg / "blkio.throttle.read_bps_device").read_text().split(),
                         (cg / "blkio.throttle.write_bps_device").read_text().split()))
            yield cg

    monkeypatch.setattr(scratch, "blkio_cgroup", spy)
    r = invoke("demo", "--workload", "fio", "--dir", str(tmp_path), "--drive-cap", "200MB/s",
               "-o", str(tmp_path / "run"), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    mib = 1 << 20
    # three 128 MiB swap files read back in 512 KiB requests, plus a little metadata;
    # the throttle releases queued requests in bursts, and adjacent ones then merge
    # (into 1 MiB, say), so the data reads are whole multiples of 512 KiB
    [dev] = doc["run"]["devices"]
    data_reads = {int(size): n for size, n in dev["directions"]["read"]["sizes"].items() if int(size) >= 512 << 10}
    assert all(size % (512 << 10) == 0 for size in data_reads), data_reads
    assert sum(size * n for size, n in data_reads.items()) == 3 * 128 * mib
    assert 3 * 128 * mib <= doc["totals"]["write_bytes"] < 3 * 128 * mib + 8 * mib
    assert "demo: scratch drive" in r.stderr and "capped at 200 MB/s" in r.stderr
    # the verdict: fio is no training job; the drive's ceiling is its cap
    verdict = doc["verdict"]
    assert verdict["limit"] == "no-training"
    [distance] = [f for f in verdict["findings"] if f["kind"] == "distance"]
    assert distance["figures"]["ceiling_bytes_per_s"] == 200e6
    # and an offline HTML report next to the run, with the same verdict at its top
    html = (tmp_path / "run" / "report.html").read_text()
    assert f"HTML report: {tmp_path / 'run' / 'report.html'}" in r.stderr
    assert html.count("<script") >= 1 and verdict["summary"].split(":")[0] in html
    # one cgroup, capping the drive at 200 MB/s each way; fio ran in it: writing and
    # reading 3 x 128 MiB at 200 MB/s takes at least 4 s (less a throttle burst)
    [(cgroup, [limit], read_bps, write_bps)] = made
    assert read_bps == write_bps == [limit.device, "200000000"]
    assert doc["run"]["duration_s"] >= 0.9 * 2 * 3 * 128 * mib / 200e6
    # nothing left behind: no image, mount, loop device or cgroup
    assert not cgroup.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert str(tmp_path) not in subprocess.run(["losetup", "-l"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
    assert not [c for c in Path("/sys/fs/cgroup/blkio").glob(f"iotune-{os.getpid()}-*")]


# A line DeepSpeed prints: its logger's (`[2026-11-28 21:23:10,226] [WARNING] [real_accelerator.py:213:
# get_accelerator] Setting accelerator to CPU. ...`), its op builders' (` [WARNING]  async_io: ...`), the
# message of an op it loads (`DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully`).
DEEPSPEED_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[(?:DEBUG|INFO|WARNING|ERROR)\] "
                            r"|^ *\[(?:INFO|WARNING)\] |^DeepSpeed \S+ built successfully")


@needs_tracing
@needs_deepspeed
def test_training_demo_shows_its_steps_and_keeps_deepspeed_in_its_log(tmp_path: Path) -> None:
    """The training demo with stderr a pipe: one plain line per step (3
    asked, 3 lines, each with the loss and time the workload logged), none
    of DeepSpeed's messages and no raw IOTUNE_STEP record (both are in the
    run's job.log), no escape codes; stdout is the report alone."""
    out = tmp_path / "run"
    r = subprocess.run([*IOTUNE, "demo", "--dir", str(tmp_path), "--steps", "3", "-o", str(out), "--json"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["run"]["outcome"] == "completed"
    log = (out / "job.log").read_text()
    records = parse_steps(log)
    assert [s.step for s in records] == [1, 2, 3]
    shown = [line for line in r.stderr.splitlines() if line.startswith("training step ")]
    assert len(shown) == 3, r.stderr
    for line, rec in zip(shown, records):
        assert re.fullmatch(rf"training step {rec.step}/3: loss {rec.loss:.4f}, step {rec.step_s:.3f} s, "
                            rf"ETA \d+:\d\d", line), (line, rec)
    assert shown[-1].endswith(", ETA 0:00")
    assert "IOTUNE_STEP" not in r.stderr and "\x1b[" not in r.stderr
    assert [line for line in log.splitlines() if DEEPSPEED_LINE.search(line)], \
        "DeepSpeed logged nothing into job.log: this test cannot tell where its output goes"
    assert [line for line in r.stderr.splitlines() if DEEPSPEED_LINE.search(line)] == []


@needs_tracing
@needs_deepspeed
def test_a_failing_training_demo_shows_the_tail_of_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload refuses its input (an unknown model size, given last so
    it wins): the report of the failed run, then job.log's last lines, then
    the error naming the log; exit status 1."""
    import iotune.demo as demo
    from iotune.workloads.presets import PRESETS

    real = demo.training_argv
    monkeypatch.setattr(demo, "training_argv", lambda where, steps, precision: [*real(where, steps, precision), "--size",
                                                                             "nope"])
    out = tmp_path / "run"
    r = invoke("demo", "--dir", str(tmp_path), "--steps", "3", "-o", str(out))
    log = out / "job.log"
    lines = log.read_text().splitlines()
    assert lines[-1] == f"iotune-train: error: unknown size 'nope': choose one of {', '.join(PRESETS)}"
    assert r.exit_code == 1, r.output
    assert r.stderr.endswith(f"--- the last {len(lines)} line{'s' * (len(lines) != 1)} of {log} ---\n"
                             + "".join(line + "\n" for line in lines[-40:])
                             + f"--- end of {log} ---\n"
                             f"Error: the demo's training run failed (exit 2): the last lines of its log {log} are "
                             f"above; `iotune doctor` checks what the demo needs\n"), r.stderr
    assert "training step " not in r.stderr
    assert load_run(out).outcome == "failed"


@pytest.mark.parametrize("cap", ["200MB/s", "200MB", "200000000"])
def test_demo_cap_takes_a_rate(cap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from iotune.errors import IotuneError

    seen = []

    def run_demo(workdir, cap_bytes_per_s, say, workload, steps, bed=None, **kw):
        seen.append(cap_bytes_per_s)
        raise IotuneError("stopped here")

    monkeypatch.setattr("iotune.demo.run_demo", run_demo)
    r = invoke("demo", "--workload", "fio", "--drive-cap", cap)
    assert (r.exit_code, r.stderr, seen) == (1, "Error: stopped here\n", [200_000_000])
