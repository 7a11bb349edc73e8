"""README promises about `iotune trace`, checked with real BPF on loop
devices: signals from a scheduler, sudo and --as-root, --with-lower, map-full
drops in the report, and timeline.csv as pandas reads it."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from iotune.blockdev.devices import BlockDevice, lower_devices
from iotune.model.runfile import load_run
from iotune.render.base import RenderOptions
from iotune.render.registry import render
from iotune.trace.session import TraceOptions, trace_command

from tests.conftest import needs_tracing

IOTUNE = [sys.executable, "-m", "iotune"]
KiB = 1024


def default_signals() -> None:
    """preexec_fn: SIGINT/SIGTERM at their defaults in the child, whatever
    this test process inherited (a CI job started in the background ignores
    SIGINT, and ignored signals stay ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_trace(args: list[str], tmp_path: Path, script: str, env: dict[str, str] | None = None
                ) -> subprocess.Popen[str]:
    """`iotune trace ARGS -- sh -c SCRIPT` in the background (stdin not a
    terminal: the command gets a process group of its own), returned once
    SCRIPT has touched tmp_path/ready."""
    p = subprocess.Popen([*IOTUNE, "trace", *args, "--", "sh", "-c", script], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=default_signals)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        if time.monotonic() > deadline or p.poll() is not None:
            p.kill()
            pytest.fail(f"the traced command never got ready: {p.communicate()[1]}")
        time.sleep(0.05)
    return p


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    """True once `pid` has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@needs_tracing
def test_scheduler_sigterm_reaches_the_commands_process_group(loop_drive: BlockDevice, tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = (f"dd if={loop_drive.path} of=/dev/null bs=4K count=11 iflag=direct 2>/dev/null; "
              f"sleep 60 & echo $! > {tmp_path}/grandchild; touch {tmp_path}/ready; wait")
    p = start_trace(["-o", str(out), "-d", loop_drive.name], tmp_path, script)
    grandchild = int((tmp_path / "grandchild").read_text())
    p.send_signal(signal.SIGTERM)          # as a scheduler's `kill PID` would
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, stderr    # sh died of the forwarded SIGTERM
    assert gone(grandchild), "the background `sleep` (same process group) did not get the SIGTERM"
    run = load_run(out)
    assert (run.outcome, run.exit_status) == ("interrupted", 143)
    assert run.devices[0].direction("read").sizes == {4 * KiB: 11}
    assert f"saved {out}" in stderr


@needs_tracing
def test_repeated_signals_escalate_without_losing_the_run(loop_drive: BlockDevice, tmp_path: Path) -> None:
    """The command outlives SIGTERM (it notes each one and goes on): the
    first two signals are forwarded as SIGTERM and iotune keeps tracing; the
    third is SIGKILL. The run is saved."""
    out, terms = tmp_path / "run", tmp_path / "terms"
    script = (f"trap 'echo >> {terms}' TERM; trap '' INT; "
              f"dd if={loop_drive.path} of=/dev/null bs=4K count=7 iflag=direct 2>/dev/null; "
              f"touch {tmp_path}/ready; while :; do sleep 60 & wait $!; done")
    p = start_trace(["-o", str(out), "-d", loop_drive.name], tmp_path, script)
    for n, sig in enumerate((signal.SIGTERM, signal.SIGTERM), 1):
        p.send_signal(sig)
        deadline = time.monotonic() + 30            # until the command has noted the n-th forwarded SIGTERM
        while not (terms.exists() and len(terms.read_text().splitlines()) == n):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()[1]
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()[1]      # iotune is still tracing
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGKILL, stderr
    run = load_run(out)
    assert (run.outcome, run.exit_status) == ("interrupted", 137)
    assert run.devices[0].direction("read").sizes == {4 * KiB: 7}
    assert "exit 137 · interrupted" in stdout


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("needs a user named nobody to stand in for the user who ran sudo")


@needs_tracing
@pytest.mark.parametrize("as_root", [False, True])
def test_under_sudo_the_command_runs_as_the_invoking_user(loop_drive: BlockDevice, tmp_path: Path,
                                                          as_root: bool) -> None:
    nobody = _nobody()
    env = dict(os.environ, SUDO_USER="nobody", SUDO_UID=str(nobody.pw_uid), SUDO_GID=str(nobody.pw_gid))
    out = tmp_path / "run"
    args = ["--json", "-o", str(out), "-d", loop_drive.name, *(["--as-root"] if as_root else []),
            "--", "sh", "-c", 'echo "who: $(id -u) $(id -g) $USER $HOME"']
    r = subprocess.run([*IOTUNE, "trace", *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    who = next(line for line in r.stderr.splitlines() if line.startswith("who: "))
    if as_root:
        assert who == f"who: 0 0 {env.get('USER', '')} {env.get('HOME', '')}"
    else:
        assert who == f"who: {nobody.pw_uid} {nobody.pw_gid} nobody {nobody.pw_dir}"
    # either way the saved run belongs to the user who ran sudo
    assert {(f.stat().st_uid, f.stat().st_gid) for f in [out, *out.iterdir()]} == {(nobody.pw_uid, nobody.pw_gid)}


@needs_tracing
def test_with_lower_traces_the_backing_disk_outside_the_totals(loop_drive: BlockDevice) -> None:
    lower = lower_devices(loop_drive)
    if not lower:
        pytest.skip("the loop device's backing file is not on a block device (tmpfs?)")
    [disk] = lower
    r = subprocess.run([*IOTUNE, "trace", "--no-save", "--json", "--with-lower", "-d", loop_drive.name, "--",
                        "dd", "if=/dev/zero", f"of={loop_drive.path}", "bs=64K", "count=19", "oflag=direct"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    devices = {d["name"]: d for d in doc["run"]["devices"]}
    assert doc["run"]["device_filter"] == [loop_drive.name, disk.name]
    assert devices[disk.name]["lower_of"] == [loop_drive.name]
    assert devices[loop_drive.name]["lower_of"] == []
    # the loop's direct writes reached the disk as well ...
    assert devices[disk.name]["directions"]["write"]["bytes"] >= 19 * 64 * KiB
    # ... but the totals are the loop device's alone
    t = doc["totals"]
    assert (t["write_requests"], t["write_bytes"]) == (19, 19 * 64 * KiB)
    assert (t["devices"], t["excluded"]) == ([loop_drive.name], [disk.name])


@needs_tracing
def test_a_full_timeline_map_is_counted_and_reported(loop_drive: BlockDevice) -> None:
    """A one-entry timeline map holds (loop, read, bucket 0); the writes that
    follow in the same interval find it full: each is counted as dropped and
    the report says so."""
    argv = ["sh", "-c", f"dd if={loop_drive.path} of=/dev/null bs=4K count=5 iflag=direct 2>/dev/null && "
                        f"dd if=/dev/zero of={loop_drive.path} bs=4K count=3 oflag=direct 2>/dev/null"]
    run = trace_command(argv, TraceOptions(devices=(loop_drive,), interval_s=60.0, timeline_entries=1))
    assert run.exit_status == 0
    assert run.drops["timeline"] == 3
    assert [(p.op, p.requests, p.bytes) for p in run.timeline] == [("read", 5, 5 * 4 * KiB)]
    # still exact where the other maps had room
    w = run.devices[0].direction("write")
    assert (w.sizes, w.completed) == ({4 * KiB: 3}, 3)
    text = render(run, "console", RenderOptions(width=200))
    assert "warning: events not recorded because a kernel map was full (timeline: 3" in text


@needs_tracing
def test_timeline_csv_reads_into_pandas(loop_drive: BlockDevice, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = subprocess.run([*IOTUNE, "trace", "--json", "--interval", "60", "-o", str(out), "-d", loop_drive.name,
                        "--", "dd", f"if={loop_drive.path}", "of=/dev/null", "bs=8K", "count=23", "iflag=direct"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "timeline.csv")
    assert list(df.columns) == ["t_s", "device", "op", "requests", "bytes"]
    assert df.to_dict("records") == [
        {"t_s": 0.0, "device": loop_drive.name, "op": "read", "requests": 23, "bytes": 23 * 8 * KiB}]
    assert str(df["requests"].dtype) == "int64" and str(df["t_s"].dtype) == "float64"
