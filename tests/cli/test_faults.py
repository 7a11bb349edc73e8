"""The fault table (docs/faults.md), tested for real: a drive that fills up
while a run or a sweep journal is saved, an --out that cannot be written, a
FUSE drive whose daemon dies mid-trial. Each test checks what is kept, that
nothing iotune made is left (loop devices, mounts, processes, files), and
the exact message. The multi-node rows (a node's ssh connection dropping or
going silent, a fleet on a full drive) are in test_fleet_trace.py, on the
node bed."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.runfile import load_run

from tests.conftest import ext4_mount, needs_fio, needs_root, needs_root_for, needs_tracing

IOTUNE = [sys.executable, "-m", "iotune"]
KiB = 1024


def source_of(mnt: Path) -> str:
    """The block device mounted at `mnt`."""
    return subprocess.run(["findmnt", "-no", "SOURCE", str(mnt)], capture_output=True, text=True,
                          check=True).stdout.strip()


def fill(mnt: Path, leave_bytes: int = 0) -> None:
    """Fill the filesystem at `mnt` with mnt/filler until writes fail with
    ENOSPC, then free `leave_bytes` (a slack file written first and removed)."""
    if leave_bytes:
        (mnt / "slack").write_bytes(b"s" * leave_bytes)
    chunk = b"f" * (64 * KiB)
    with (mnt / "filler").open("wb", buffering=0) as fh:
        while chunk:
            try:
                fh.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                chunk = chunk[: len(chunk) // 2]
    if leave_bytes:
        (mnt / "slack").unlink()
    os.sync()           # the freed blocks are reusable once the journal has committed


def loops_over(tmp_path: Path, timeout_s: float = 30.0) -> list[str]:
    """Loop devices whose backing file is under tmp_path, once none is left
    or at the deadline. `losetup -d` of a device still open for a moment
    after its unmount only marks it to detach on its last close, so the
    detach is awaited, not assumed."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["losetup", "-n", "-O", "NAME,BACK-FILE", "-l"], capture_output=True, text=True,
                             check=True).stdout
        left = [line.split()[0] for line in out.splitlines() if str(tmp_path) in line]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def mounts_under(tmp_path: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(tmp_path))]


# ---- 1. a drive that fills up while `iotune trace` saves its run ---------------------------------

def trace_dd(out: Path, loop: str, spare_tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`iotune trace` of 23 direct 8 KiB reads of `loop`, saved to `out`,
    with the temporary directory (the spare place) at spare_tmp."""
    return subprocess.run([*IOTUNE, "trace", *extra, "--interval", "60", "-o", str(out), "-d", loop, "--",
                           "dd", f"if={loop}", "of=/dev/null", "bs=8K", "count=23", "iflag=direct"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**os.environ, "TMPDIR": str(spare_tmp)})


def reads_of(run_dir: Path, device: str) -> tuple[int, int]:
    """(requests, bytes) read on `device` in the saved run, from its timeline."""
    run = load_run(run_dir)
    points = [p for p in run.timeline if p.device == device and p.op == "read"]
    return sum(p.requests for p in points), sum(p.bytes for p in points)


@needs_tracing
def test_a_run_that_does_not_fit_on_the_out_drive_is_saved_in_the_temporary_directory(tmp_path: Path) -> None:
    spare_tmp = tmp_path / "tmp"
    spare_tmp.mkdir()
    with ext4_mount(tmp_path, 8 << 20) as mnt:
        loop = source_of(mnt)
        out = mnt / "run"
        out.mkdir()                     # the run's directory fits; its files do not
        fill(mnt, leave_bytes=2 * KiB)   # room for part of the run (about 4 KiB), not all of it
        r = trace_dd(out, loop, spare_tmp)
        spare = spare_tmp / "iotune-runs" / "run"
        assert r.returncode == 1, r.stderr
        assert r.stderr.splitlines()[-1] == (
            f"Error: disk full: the run could not be saved to {out} (No space left on device); it was saved to "
            f"{spare} instead (iotune report {spare}): free space there and move it back with "
            f"`mv {spare}/* {out}/`, or leave it where it is")
        # kept: the whole run, where the message says, loadable, with the exact 23 reads
        assert sorted(os.listdir(spare)) == ["run.json", "timeline.csv", "timeline.npz"]
        assert reads_of(spare, Path(loop).name) == (23, 23 * 8 * KiB)
        # no half-written file on the full drive: the temporary files it began are removed
        assert os.listdir(out) == []
        assert sorted(os.listdir(mnt)) == ["filler", "lost+found", "run"]
        # the report still reached stdout
        assert "loop" in r.stdout
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []


@needs_tracing
def test_a_run_that_fits_nowhere_says_so_after_printing_the_report(tmp_path: Path) -> None:
    with ext4_mount(tmp_path, 8 << 20) as mnt:
        loop = source_of(mnt)
        spare_tmp = mnt / "tmp"
        spare_tmp.mkdir()               # the temporary directory is on the full drive too
        fill(mnt)
        out = mnt / "run"
        r = trace_dd(out, loop, spare_tmp, "--json")
        spare = spare_tmp / "iotune-runs" / "run"
        assert r.returncode == 1, r.stderr
        assert r.stderr.splitlines()[-1] == (
            f"Error: disk full: the run could not be saved to {out} (No space left on device) nor to {spare} (No "
            f"space left on device); nothing of it was written to either, and the report printed is all that is "
            f"left of it: free space on that drive or give --out a drive with room, and run the command again")
        # kept: the record on stdout, with the exact 23 reads
        doc = json.loads(r.stdout)
        [dev] = [d for d in doc["run"]["devices"] if d["name"] == Path(loop).name]
        assert (dev["directions"]["read"]["requests"], dev["directions"]["read"]["bytes"]) == (23, 23 * 8 * KiB)
        # nothing half-written, and no directory it made is left
        assert sorted(os.listdir(mnt)) == ["filler", "lost+found", "tmp"]
        assert os.listdir(spare_tmp) == []
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []


@needs_tracing
def test_a_run_whose_out_drive_went_read_only_during_the_trace_is_saved_in_the_temporary_directory(
        tmp_path: Path) -> None:
    """The same fallback when the drive is not full but was remounted
    read-only while the command ran (as ext4 does itself on errors)."""
    spare_tmp = tmp_path / "tmp"
    spare_tmp.mkdir()
    with ext4_mount(tmp_path, 8 << 20) as mnt:
        loop = source_of(mnt)
        out = mnt / "run"
        r = subprocess.run([*IOTUNE, "trace", "--interval", "60", "-o", str(out), "-d", loop, "--", "sh", "-c",
                            f"dd if={loop} of=/dev/null bs=8K count=23 iflag=direct status=none && "
                            f"mount -o remount,ro {mnt}"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           env={**os.environ, "TMPDIR": str(spare_tmp)})
        spare = spare_tmp / "iotune-runs" / "run"
        assert r.returncode == 1, r.stderr
        assert r.stderr.splitlines()[-1] == (
            f"Error: the run could not be saved to {out} (Read-only file system); it was saved to {spare} instead "
            f"(iotune report {spare}): once it can be written again, move it back with `mv {spare} {out}`, or "
            f"leave it where it is")
        assert reads_of(spare, Path(loop).name) == (23, 23 * 8 * KiB)
        assert os.listdir(mnt) == ["lost+found"]
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []


# ---- 2. an --out that cannot be written: refused before the command runs ------------------------

def invoke_trace(out: Path, marker: Path) -> object:
    return CliRunner().invoke(cli, ["trace", "-o", str(out), "--", "sh", "-c", f"touch {marker}"])


@needs_root_for("a read-only mount")
def test_an_out_on_a_read_only_filesystem_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with ext4_mount(tmp_path, 8 << 20) as mnt:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        r = invoke_trace(mnt / "runs" / "r1", marker)
        assert r.exit_code == 2
        assert r.stderr == (f"Error: cannot save the run to {mnt}/runs/r1: {mnt} is on a read-only filesystem; "
                            f"give --out a directory on a writable drive (or --no-save)\n")
        assert not marker.exists()                  # the command never ran
        assert os.listdir(mnt) == ["lost+found"]
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []


def test_an_out_under_a_file_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "notes").write_text("a file\n")
    r = invoke_trace(tmp_path / "notes" / "run", marker)
    assert r.exit_code == 2
    assert r.stderr == (f"Error: cannot save the run to {tmp_path}/notes/run: {tmp_path}/notes is a file, not a "
                        f"directory; give --out a path that is not under a file (or --no-save)\n")
    r = invoke_trace(tmp_path / "notes", marker)          # the file itself: click's own check, as exact
    assert r.exit_code == 2
    assert r.stderr.endswith(f"Error: Invalid value for '-o' / '--out': Directory '{tmp_path}/notes' is a file.\n")
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == ["notes"]
    assert (tmp_path / "notes").read_text() == "a file\n"


def test_demo_refuses_an_unwritable_out_before_it_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []
    monkeypatch.setattr("iotune.demo.run_demo", lambda *a, **kw: ran.append(a))
    (tmp_path / "notes").write_text("a file\n")
    r = CliRunner().invoke(cli, ["demo", "--workload", "fio", "-o", str(tmp_path / "notes" / "run")])
    assert r.exit_code == 2
    assert r.stderr == (f"Error: cannot save the run to {tmp_path}/notes/run: {tmp_path}/notes is a file, not a "
                        f"directory; give --out a path that is not under a file\n")
    assert ran == [] and sorted(os.listdir(tmp_path)) == ["notes"]


@needs_root_for("running iotune as another user")
def test_an_out_without_write_permission_is_refused_before_the_command_runs() -> None:
    """As user nobody (root may write anywhere), in a directory nobody can
    traverse to but not write in. As nobody the trace could not load its
    probes either: what this checks is that the --out check comes first,
    with its own message and exit status."""
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            "import iotune"], capture_output=True, cwd="/")
    if probe.returncode != 0:
        pytest.skip("needs the checkout and its venv readable by user nobody")
    locked = Path(tempfile.mkdtemp(prefix="iotune-locked-"))
    try:
        locked.chmod(0o755)
        marker = locked.parent / f"{locked.name}-ran"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *IOTUNE, "trace",
                            "-o", str(locked / "run"), "--", "sh", "-c", f"touch {marker}"],
                           capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        assert r.returncode == 2, r.stderr
        assert r.stderr == (f"Error: cannot save the run to {locked}/run: no permission to write in {locked}; "
                            f"give --out a directory you can write to (or --no-save)\n")
        assert not marker.exists()
        assert os.listdir(locked) == []
    finally:
        locked.rmdir()


# ---- 4. a sweep journal on a drive that fills up -----------------------------------------------

SWEEP_PROFILE = ('[space]\nblock_size = ["64K", "256K"]\nqueue_depth = [1, 4]\nintra_op_parallelism = [1]\n'
                 'single_submit = [false]\noverlap_events = [true]\n'
                 '[run]\nrepeats = 1\nfinalists = 1\nconfirm_top = 0\nfile_bytes = "1M"\nfiles = 2\n')


def sweep_into(work: Path, out: Path, *args: str) -> object:
    """A fio grid sweep of work/drive (ext4 on the root disk) journaled in `out`."""
    return CliRunner().invoke(cli, ["sweep", "--path", str(work / "drive"), "--profile", str(work / "p.toml"),
                                    "-o", str(out), "--json", "--grid", *args])


def journal_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_fio
@needs_root_for("a small ext4 loop mount")
def test_a_full_journal_drive_stops_the_sweep_keeping_whole_lines_and_resume_skips_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # DeepSpeed's check of the recommended fragment loads its async_io op: tested in test_sweep_e2e.py
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))    # no DeepSpeed op is loaded here
    (tmp_path / "p.toml").write_text(SWEEP_PROFILE)
    (tmp_path / "drive").mkdir()
    with ext4_mount(tmp_path, 8 << 20) as mnt:
        out = mnt / "sweep"
        journal = out / "journal.jsonl"
        first = sweep_into(tmp_path, out, "--block-sizes", "64K")         # 2 of the 4 points
        assert first.exit_code == 0, first.stderr[-2000:]
        kept = journal.read_bytes()
        fill(mnt, leave_bytes=2 * KiB)             # room for part of a trial's line, not all of it
        r = sweep_into(tmp_path, out)
        assert r.exit_code == 1
        assert r.stdout == ""
        assert r.stderr.splitlines()[-1] == (
            f"Error: disk full: the sweep journal {journal} cannot take the trial that just ended (No space left "
            f"on device); it keeps the 2 trial(s) completed before it, every line whole, and that trial runs again "
            f"on resume: free space on that drive (or give -o/--out a directory on another drive, with the journal "
            f"moved there), then run the same command again to resume")
        # kept: every complete line, byte for byte, and no torn line after them
        assert journal.read_bytes() == kept
        assert [rec["kind"] for rec in journal_lines(journal)] == ["header", "trial", "trial"]
        assert os.listdir(tmp_path / "drive") == []             # the trial's files are removed
        (mnt / "filler").unlink()
        resumed = sweep_into(tmp_path, out)
        assert resumed.exit_code == 0, resumed.stderr[-2000:]
        doc = json.loads(resumed.stdout)
        assert (doc["trials"], doc["trials_run_now"], doc["failed"]) == (4, 2, 0)
        assert journal.read_bytes().startswith(kept)
        trials = [rec for rec in journal_lines(journal) if rec["kind"] == "trial"]
        assert sorted((t["point"]["block_size"], t["point"]["queue_depth"]) for t in trials) == [
            (64 * KiB, 1), (64 * KiB, 4), (256 * KiB, 1), (256 * KiB, 4)]
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []
    assert os.listdir(tmp_path / "drive") == []


# ---- 3. a FUSE drive whose daemon dies mid-trial ----------------------------------------------

BED_PROFILE = ('[space]\nblock_size = ["256K", "1M"]\nqueue_depth = [8]\nintra_op_parallelism = [1]\n'
               'single_submit = [false]\noverlap_events = [true]\n'
               '[run]\nrepeats = 1\nfinalists = 1\nconfirm_top = 0\nfile_bytes = "8M"\nfiles = 1\n'
               'runtime_s = 1.0\nramp_s = 0.25\n')


def wait_for(what: str, ready: object, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> object:
    """Poll the observable `ready()` until it is truthy (its value is
    returned); fail naming `what` if `proc` exits or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not (value := ready()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never saw {what}: {proc.communicate()[1][-3000:]}")
        time.sleep(0.02)
    return value


def fuse_daemon_of(pid: int) -> tuple[int, Path] | None:
    """(pid, mount directory) of the emulated drive's FUSE daemon started by process `pid`."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if fields[1].split()[1] == str(pid) and Path(argv[0].decode()).name.startswith("latency_drive"):
            return int(stat.parent.name), Path(argv[-2].decode())
    return None


def fio_child_of(pid: int) -> int | None:
    """The fio process started by process `pid`, if one runs."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        if comm.endswith("(fio") and rest.split()[1] == str(pid) and rest.split()[0] not in "ZX":
            return int(stat.parent.name)
    return None


def requests_served(mount_dir: Path) -> int:
    counters = dict(line.split() for line in (mount_dir / "stats").read_text().splitlines() if line.strip())
    return int(counters["reads"]) + int(counters["writes"])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@needs_fio
@needs_root
def test_a_bed_drive_whose_daemon_dies_mid_trial_stops_the_sweep_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spare_tmp = tmp_path / "tmp"                     # the bed's files go in the temporary directory
    spare_tmp.mkdir()
    (tmp_path / "p.toml").write_text(BED_PROFILE)
    journal = tmp_path / "j" / "journal.jsonl"
    env = {**os.environ, "TMPDIR": str(spare_tmp), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    p = subprocess.Popen([*IOTUNE, "sweep", "--bed", "builtin", "--grid", "--profile", str(tmp_path / "p.toml"),
                          "-o", str(tmp_path / "j")], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        daemon, mount_dir = wait_for("the bed's FUSE daemon", lambda: fuse_daemon_of(p.pid), p)
        wait_for("the first trial in the journal",
                 lambda: journal.exists() and journal.read_text().count("\n") >= 2, p)
        wait_for("the second trial's fio", lambda: fio_child_of(p.pid), p)
        served = requests_served(mount_dir)
        wait_for("the second trial's I/O", lambda: requests_served(mount_dir) > served, p)
        os.kill(daemon, signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err[-3000:]
    assert out == ""
    loop = next(line.split()[4].rstrip(":") for line in err.splitlines()
                if line.startswith("sweep: built-in emulated drive "))
    header, first = journal_lines(journal)
    assert header["kind"] == "header" and first["kind"] == "trial" and first["status"] == "ok"
    second_bs = ({256 * KiB, 1 << 20} - {first["point"]["block_size"]}).pop()
    assert err.splitlines()[-1] == (
        f"Error: the emulated drive {loop} of test bed builtin is gone: its FUSE daemon (pid {daemon}) has exited, "
        f"so every request to the drive fails. The trial bs={second_bs} qd=8 t=1 rep 0 failed on it and is not "
        f"recorded; the journal {journal} keeps the 1 trial(s) completed before it: run the same command again "
        f"to resume on a fresh drive")
    assert "Traceback" not in err
    # reclaimed: the daemon (reaped), the loop device, mounts, the cgroup and the bed's files
    assert not alive(daemon)
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []
    assert list(Path("/sys/fs/cgroup/blkio").glob(f"iotune-{p.pid}-*")) == []
    assert os.listdir(spare_tmp) == []
    # resumed on a fresh bed: the completed trial is reused, only the failed one runs again
    # (DeepSpeed's check of the recommended fragment loads its async_io op: tested in test_sweep_e2e.py)
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    for name in ("TMPDIR", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.setenv(name, env[name])
    kept = journal.read_text()
    r = CliRunner().invoke(cli, ["sweep", "--bed", "builtin", "--grid", "--profile", str(tmp_path / "p.toml"),
                                 "-o", str(tmp_path / "j"), "--json"])
    assert r.exit_code == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert (doc["trials"], doc["trials_run_now"], doc["failed"]) == (2, 1, 0)
    assert journal.read_text().startswith(kept)
    assert sorted(t["point"]["block_size"] for t in journal_lines(journal)[1:]) == [256 * KiB, 1 << 20]
    assert mounts_under(tmp_path) == [] and os.listdir(spare_tmp) == []
    assert loops_over(tmp_path) == []


def test_a_torn_last_line_left_by_a_crash_does_not_swallow_the_next_trial(tmp_path: Path) -> None:
    """A crash mid-append (before this fix, or a power cut) leaves a line
    without its newline; the next append starts a line of its own, so the
    resumed sweep keeps the new trial (the torn one is skipped, as before)."""
    from iotune.model.journal import SweepEnv
    from iotune.model.sweep import SweepPoint, Trial
    from iotune.sweep.journal import Journal

    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.start(SweepEnv(executor="fio"))
    with path.open("a") as fh:
        fh.write('{"kind":"trial","executor":"fio","poi')           # torn
    trial = Trial("fio", SweepPoint(block_size=1 << 20, queue_depth=8), 0, "failed", None, "boom", "", 0.5, {})
    Journal(path).record(trial)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[1] == '{"kind":"trial","executor":"fio","poi'
    assert Journal(path).trials == [trial]


def test_an_executor_error_on_a_drive_known_gone_names_the_drive(tmp_path: Path) -> None:
    """The executor's own file access on a dead drive (an ext4 gone read-only
    under fio's result file) raises OSError, not TrialFailed: the drive is
    still named when its trouble is known, and the error is unchanged when not."""
    from iotune.model.sweep import SweepPoint
    from iotune.sweep.executor import DriveGone, Target
    from iotune.sweep.journal import Journal
    from iotune.sweep.measure import Measurer

    class ReadOnlyNow:
        name = "fio"

        def run(self, point: SweepPoint, target: Target) -> tuple:
            raise OSError(errno.EROFS, "Read-only file system")

    journal = Journal(tmp_path / "journal.jsonl")
    gone = Target(tmp_path, trouble=lambda: "the emulated drive /dev/loop9 of test bed builtin is gone")
    with pytest.raises(DriveGone) as e:
        Measurer(ReadOnlyNow(), gone, journal).measure(SweepPoint(block_size=1 << 20, queue_depth=8))
    assert str(e.value) == (f"the emulated drive /dev/loop9 of test bed builtin is gone. The trial bs=1048576 qd=8 "
                            f"t=1 rep 0 failed on it and is not recorded; the journal {tmp_path}/journal.jsonl keeps "
                            f"the 0 trial(s) completed before it: run the same command again to resume on a fresh "
                            f"drive")
    healthy = Target(tmp_path, trouble=lambda: None)
    with pytest.raises(OSError):
        Measurer(ReadOnlyNow(), healthy, journal).measure(SweepPoint(block_size=1 << 20, queue_depth=8))
    assert not (tmp_path / "journal.jsonl").exists()
