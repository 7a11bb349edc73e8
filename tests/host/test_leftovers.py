"""A hard kill leaves nothing behind.

SIGKILL cannot be caught, so iotune keeps a ledger of what it makes
(iotune/host/ledger.py). Each command that makes loop devices, mounts,
cgroups, scratch files, FUSE daemons or processes is killed here with
SIGKILL at random moments, several times; after the next command that makes
something (or `iotune doctor --fix`) nothing of iotune's may remain, and a
loop device and mount that iotune did not make, beside them, stay untouched.

The random moments come from a seeded generator; the seed is printed on
failure (IOTUNE_KILL_SEED=N reproduces a run)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from iotune.host import ledger
from iotune.fs.mountinfo import mount_points
from iotune.host.undo import namespace_pids

from tests.conftest import ext4_mount, needs_bpf, needs_deepspeed, needs_fio, needs_root, needs_tracing

READY_TIMEOUT_S = 60.0
BLKIO = Path("/sys/fs/cgroup/blkio")


def _iotune(argv: list[str], tmpdir: Path, **kw: object) -> subprocess.Popen[str]:
    """`iotune ARGV` as a child whose temporary files go to `tmpdir`."""
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env.pop(ledger.OWNER_ENV, None)           # it is nobody's child here: its own ledger decides
    child: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-m", "iotune", *argv], env=env, text=True, stdin=subprocess.DEVNULL, **kw)
    return child


# -- what is there -------------------------------------------------------------

def _loops() -> dict[str, str]:
    out = subprocess.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
                         capture_output=True, text=True, check=True).stdout
    return {lo["name"]: lo["back-file"] for lo in (json.loads(out)["loopdevices"] if out.strip() else [])}


def _environ_var(pid: int, name: str) -> str | None:
    with contextlib.suppress(OSError):
        for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if var.startswith(name.encode() + b"="):
                return var.split(b"=", 1)[1].decode()
    return None


def _environ_owner(pid: int) -> str | None:
    return _environ_var(pid, ledger.OWNER_ENV)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


@dataclass(frozen=True)
class Foreign:
    """A loop device with ext4 mounted, made without iotune, and a file on it."""

    loop: str
    mnt: Path
    digest: str

    def intact(self) -> bool:
        return (self.loop in _loops() and os.path.ismount(self.mnt)
                and hashlib.sha256((self.mnt / "data").read_bytes()).hexdigest() == self.digest)


@contextlib.contextmanager
def foreign_drive(tmp_path: Path) -> Iterator[Foreign]:
    where = tmp_path / "foreign"
    where.mkdir()
    with ext4_mount(where, 32 << 20) as mnt:
        (mnt / "data").write_bytes(os.urandom(1 << 20))
        os.sync()
        loop = next(name for name, back in _loops().items() if back.startswith(str(where)))
        yield Foreign(loop, mnt, hashlib.sha256((mnt / "data").read_bytes()).hexdigest())


def left_behind(root: Path, killed: list[int], foreign: Foreign, kept: tuple[Path, ...] = (),
                theirs: tuple[str, ...] = ()) -> list[str]:
    """Everything of the killed commands' that is still there: loop devices
    over files under `root`, mounts under it, their cgroups, their processes,
    files under `root` other than `kept` (their outputs) and their ledgers."""
    left = [f"loop {name} over {back}" for name, back in _loops().items()
            if name != foreign.loop and name not in theirs and (back.startswith(str(root)) or back == "/disk")]
    left += [f"mount {m}" for m in sorted(mount_points())
             if m.startswith(str(root)) and m != str(foreign.mnt)]
    left += [f"cgroup {cg}" for pid in killed for cg in BLKIO.glob(f"iotune-{pid}-*")]
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        owner = _environ_owner(pid) or ""
        if pid != os.getpid() and (any(owner.startswith(f"{k}-") for k in killed) or str(root) in _cmdline(pid)):
            left.append(f"process {pid} {_cmdline(pid)[:80]}")
    skip = (foreign.mnt.parent, *kept)
    left += [f"file {p}" for p in sorted(root.rglob("*"))
             if not p.is_dir() and not any(p == k or k in p.parents for k in skip)]
    left += [f"ledger {d}: {sorted(f.name for f in d.iterdir())}" for pid in killed
             for d in ledger.state_dir().glob(f"{pid}-*")]
    return left


# -- the tests -----------------------------------------------------------------

@needs_root
def test_doctor_names_what_a_killed_scratch_left_and_fix_removes_only_that(tmp_path: Path) -> None:
    with foreign_drive(tmp_path) as foreign:
        run = tmp_path / "run"
        run.mkdir()
        child = _iotune(["volumes", "scratch", "--drives", "2", "--size", "16M", "--drive-cap", "50MB/s", "--dir",
                         str(run)], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert child.stdout is not None
        drives = [child.stdout.readline().rstrip("\n").split("\t") for _ in range(2)]
        child.kill()
        child.wait()
        assert all(len(d) == 3 for d in drives), drives
        loops, images = {d[0] for d in drives}, {d[1] for d in drives}
        cgroups = {d[2].removeprefix("cgroup ") for d in drives}
        assert {_loops()[lo] for lo in loops} == images and all(Path(cg).is_dir() for cg in cgroups)

        doctor = subprocess.run([sys.executable, "-m", "iotune", "doctor", "--json"], capture_output=True, text=True)
        [check] = [c for c in json.loads(doctor.stdout) if c["name"] == "leftovers"]
        assert doctor.returncode == 1 and check["status"] == "fail" and check["fixable"]
        assert check["detail"].startswith("6 left by iotune runs that were killed: ")
        for lo in loops:
            assert f"loop device {lo} over {_loops()[lo]} [from `" in check["detail"]
        for thing in [*(f"blkio cgroup {cg}" for cg in cgroups), *(f"file {im}" for im in images)]:
            assert f"{thing} [from `" in check["detail"]
        assert check["fix"] == "iotune doctor --fix (removes only what iotune made)"

        fixed = subprocess.run([sys.executable, "-m", "iotune", "doctor", "--fix", "--json"],
                               capture_output=True, text=True)
        assert sorted(line for line in fixed.stderr.splitlines() if line.startswith("fixed: ")) == sorted(
            [f"fixed: removed blkio cgroup {cg}" for cg in cgroups]
            + [f"fixed: removed loop device {lo} over {_loops().get(lo, d)}" for lo, d in
               ((d[0], d[1]) for d in drives)]
            + [f"fixed: removed file {im}" for im in images]), fixed.stderr
        [check] = [c for c in json.loads(fixed.stdout) if c["name"] == "leftovers"]
        assert check["status"] == "ok"
        assert left_behind(tmp_path, [child.pid], foreign) == []
        assert foreign.intact()


@needs_root
def test_doctor_fix_removes_the_ledger_of_a_run_killed_before_it_made_anything(tmp_path: Path) -> None:
    """Killed between opening its ledger and its first record, a run leaves
    only its ledger's directory: nothing for the check to report, and
    still --fix's to remove (another owner's, alive, stays)."""
    state = tmp_path / "state"
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert ledger.owner_key(dead.pid) is None
    killed = state / f"{dead.pid}-1-{ledger.boot_id()}"
    alive = state / str(ledger.owner_key(os.getpid()))
    for d in (killed, alive):
        d.mkdir(parents=True)
        (d / "owner.txt").write_text("iotune demo\n")
    env = {**os.environ, "IOTUNE_STATE_DIR": str(state)}
    doctor = subprocess.run([sys.executable, "-m", "iotune", "doctor", "--json"], capture_output=True, text=True,
                            env=env)
    [check] = [c for c in json.loads(doctor.stdout) if c["name"] == "leftovers"]
    assert check["status"] == "ok"
    subprocess.run([sys.executable, "-m", "iotune", "doctor", "--fix", "--json"], capture_output=True, env=env)
    assert (killed.exists(), alive.exists()) == (False, True)


@dataclass(frozen=True)
class Killable:
    """A command that makes things, and how long it takes to get going (s)."""

    argv: Callable[[Path], list[str]]
    span_s: float
    kept: Callable[[Path], tuple[Path, ...]] = lambda d: ()
    needs: tuple[pytest.MarkDecorator, ...] = ()      # requirement markers beyond root


def _users_dir(d: Path) -> str:
    """A directory of the user's own for `sweep --path`: what the trials put
    there must be gone after a kill (the files under it are not `kept`)."""
    (d / "nvme").mkdir(exist_ok=True)
    return str(d / "nvme")


KILLABLE = {
    "demo": Killable(lambda d: ["demo", "--workload", "fio", "--dir", str(d), "-o", str(d / "out")], 10.0,
                     lambda d: (d / "out",), (needs_bpf, needs_fio)),
    "volumes scratch": Killable(lambda d: ["volumes", "scratch", "--drives", "2", "--size", "32M", "--dir", str(d)],
                                4.0),
    "volumes bed": Killable(lambda d: ["volumes", "bed", "latency-bound", "--dir", str(d)], 6.0),
    "sweep": Killable(lambda d: ["sweep", "--bed", "latency-bound", "--profile", "quick", "-o", str(d / "out")],
                      15.0, lambda d: (d / "out",), (needs_fio,)),
    "sweep --path": Killable(lambda d: ["sweep", "--path", _users_dir(d), "--profile", "quick", "-o", str(d / "out")],
                             10.0, lambda d: (d / "out",), (needs_fio,)),
    "sweep layouts": Killable(lambda d: ["sweep", "layouts", "--drives", "1", "--profile", "quick", "--drive-cap",
                                         "100MB/s", "-o", str(d / "out")], 12.0, lambda d: (d / "out",), (needs_fio,)),
    "sweep offload": Killable(lambda d: ["sweep", "offload", "--model", "tiny", "--max-trials", "1",
                                         "-o", str(d / "out")], 25.0, lambda d: (d / "out",), (needs_deepspeed, needs_fio)),
}
KILLS = 2                     # random points per command and run (seeded by the clock: runs add up)


def _seed() -> int:
    return int(os.environ.get("IOTUNE_KILL_SEED") or time.time_ns() % 1_000_000)


def _next_command_reclaims(probe: Path, tmpdir: Path) -> str:
    """Run a command that makes something (a scratch drive) until it has
    made it, then stop it: its start reclaimed what killed runs left."""
    probe.mkdir()
    child = _iotune(["volumes", "scratch", "--size", "16M", "--drive-cap", "0", "--dir", str(probe)], tmpdir,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    said = []
    for line in child.stderr:
        said.append(line)
        if line.startswith("drives ready"):
            break
    child.send_signal(signal.SIGTERM)
    said += child.stderr.readlines()
    child.wait(timeout=30)
    assert child.returncode == 0, "".join(said)
    return "".join(said)


@needs_root
@pytest.mark.parametrize("name", [pytest.param(name, marks=what.needs) for name, what in KILLABLE.items()])
def test_a_command_killed_at_random_leaves_nothing(tmp_path: Path, name: str) -> None:
    what, seed = KILLABLE[name], _seed()
    rng = random.Random(seed)
    with foreign_drive(tmp_path) as foreign:
        killed: list[int] = []
        kept: tuple[Path, ...] = ()
        for i in range(KILLS):
            d = tmp_path / f"kill{i}"
            (d / "tmp").mkdir(parents=True)
            kept += what.kept(d)
            child = _iotune(what.argv(d), d / "tmp", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            at = rng.uniform(0.3, what.span_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=at)           # the kill is due at `at` seconds (or it ended by itself)
            child.kill()
            child.wait()
            killed.append(child.pid)
            if i == 1:
                fixed = subprocess.run([sys.executable, "-m", "iotune", "doctor", "--fix"],
                                       capture_output=True, text=True)
                assert "Traceback" not in fixed.stderr, fixed.stderr
                said = fixed.stdout + fixed.stderr
            else:
                said = _next_command_reclaims(d / "probe", d / "tmp")
            left = left_behind(tmp_path, killed, foreign, kept)
            assert left == [], f"{name} killed after {at:.2f} s (IOTUNE_KILL_SEED={seed}): {left}\n{said}"
            assert foreign.intact(), f"IOTUNE_KILL_SEED={seed}"


@needs_tracing
@needs_deepspeed
def test_a_killed_training_demo_leaves_no_training_process(tmp_path: Path) -> None:
    """The demo's DeepSpeed run (a grandchild, busy on the scratch drive's
    mount) is iotune's too: the next command kills it, then unmounts."""
    with foreign_drive(tmp_path) as foreign:
        d = tmp_path / "demo"
        (d / "tmp").mkdir(parents=True)
        child = _iotune(["demo", "--dir", str(d), "-o", str(d / "out"), "--steps", "200"], d / "tmp",
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert child.stderr is not None
        for line in child.stderr:                         # until the traced training run starts
            if line.startswith("demo: 200 steps"):
                break
        deadline = time.monotonic() + 4 * READY_TIMEOUT_S
        swapping = None
        while swapping is None and time.monotonic() < deadline:   # until it swaps to the drive
            swapping = next(d.rglob("*.tensor.swp"), None)
            time.sleep(0.1)
        assert swapping is not None, "the demo's training run never swapped to the scratch drive"
        train = [p for p in Path("/proc").glob("[0-9]*")      # this demo's, not another job's on the machine
                 if "iotune.workloads.train" in (cmd := _cmdline(int(p.name))) and str(d) in cmd]
        assert train, "the demo's training run is not running"
        child.kill()
        child.wait()
        assert (_environ_owner(int(train[0].name)) or "").startswith(f"{child.pid}-")   # it carries the demo's mark
        tmp = Path(_environ_var(int(train[0].name), "TMPDIR") or "/")      # its temporary files (DeepSpeed's
        recorded = [Path(e.facts["path"]) for o in ledger.state_dir().glob(f"{child.pid}-*")   # compile probes)
                    for e in ledger.read_entries(o) if e.kind == "dir"]          # go with a recorded directory
        assert any(r == tmp or r in tmp.parents for r in recorded), (tmp, recorded)
        assert d / "tmp" in tmp.parents
        said = _next_command_reclaims(d / "probe", d / "tmp")
        assert f"reclaimed what killed iotune runs left: killed process {train[0].name} (python" in said, said
        assert left_behind(tmp_path, [child.pid], foreign, (d / "out",)) == []
        assert _state(int(train[0].name)) in ("Z", "X")              # gone (a zombie only waits for its reaper)
        assert foreign.intact()



BED_HOLDER = """
import sys
from pathlib import Path
from tests.beds.nodes import node_bed
from tests.beds.slurm import slurm_bed
with node_bed([0, 50_000_000], shared_path=Path(sys.argv[1]), size_bytes=64 << 20) as bed:
    if sys.argv[2] == "slurm":
        with slurm_bed(bed) as cluster:
            print("ready", cluster.directory, *(n.sshd_pid for n in bed.nodes), flush=True)
            sys.stdin.read()
    else:
        print("ready", bed.directory, *(n.sshd_pid for n in bed.nodes), flush=True)
        sys.stdin.read()
"""


@needs_root
@pytest.mark.parametrize("cluster", ["ssh", "slurm"])
def test_a_killed_bed_holder_leaves_no_node_behind(tmp_path: Path, cluster: str) -> None:
    """The multi-node bed (sshd per node, each in its own mount namespace)
    and the Slurm bed on it (munged, slurmctld, a slurmd per node), held by a
    process killed with SIGKILL: `iotune doctor --fix` stops every node and
    daemon and removes their drives, cgroups and directories."""
    from tests.nodebed import MISSING
    from tests.slurmbed import missing_for_slurmbed

    missing = MISSING or (missing_for_slurmbed() if cluster == "slurm" else None)
    if missing:
        pytest.skip(missing)
    with foreign_drive(tmp_path) as foreign:
        shared = tmp_path / "shared"
        (tmp_path / "tmp").mkdir()
        # munged's socket path must stay under 108 bytes: the Slurm bed's directory stays in /tmp
        env = {**os.environ, **({"TMPDIR": str(tmp_path / "tmp")} if cluster == "ssh" else {})}
        child = subprocess.Popen([sys.executable, "-c", BED_HOLDER, str(shared), cluster], text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert child.stdout is not None and child.stderr is not None
        ready = child.stdout.readline().split()
        if ready[:1] != ["ready"]:
            child.kill()
            pytest.fail(f"the bed did not come up: {child.stderr.read()[-2000:]}")
        directory, sshd_pids = ready[1], [int(p) for p in ready[2:]]
        namespaces = [os.readlink(f"/proc/{pid}/ns/mnt") for pid in sshd_pids]
        daemons = [int(p.name) for p in Path("/proc").glob("[0-9]*") if directory in _cmdline(int(p.name))]
        # munged, slurmctld, 2 slurmds | 2 sshds (and a connection's child, while a readiness probe's lasts)
        assert len(daemons) >= (4 if cluster == "slurm" else 2), daemons
        daemons += sshd_pids
        child.kill()
        child.wait()
        fixed = subprocess.run([sys.executable, "-m", "iotune", "doctor", "--fix"], capture_output=True, text=True)
        assert "Traceback" not in fixed.stderr, fixed.stderr
        for ns, address in zip(namespaces, ("127.0.0.2", "127.0.0.3")):
            assert f"fixed: removed processes of mount namespace {ns} (bed node {address})" in fixed.stderr
        assert [pid for pid in daemons if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)] == []
        assert [ns for ns in namespaces if namespace_pids(ns)] == []
        assert left_behind(tmp_path, [child.pid], foreign) == []
        assert not Path(directory).exists() and not shared.exists()
        assert foreign.intact()


def _state(pid: int) -> str:
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return "X"


@needs_root
def test_a_killed_volume_build_gives_the_device_back(tmp_path: Path) -> None:
    """`volumes build` on a device that is not iotune's (a blank loop device
    the test made) killed at random moments: its mount goes and the queue
    setting it changed comes back; the device itself, which iotune did not
    make, stays attached."""
    from tests.conftest import make_loops

    seed = _seed()
    rng = random.Random(seed)
    with foreign_drive(tmp_path) as foreign:
        (tmp_path / "member").mkdir()
        [member] = make_loops(tmp_path / "member", 1, 64 << 20)
        knob = Path("/sys/block", Path(member).name, "queue", "read_ahead_kb")
        before = knob.read_text().strip()
        try:
            for i in range(KILLS):
                d = tmp_path / f"kill{i}"
                (d / "tmp").mkdir(parents=True)
                child = _iotune(["volumes", "build", member, "--fs", "ext4", "--queue", "read_ahead_kb=4096",
                                 "--mount-point", str(d / "mnt")], d / "tmp", stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
                at = rng.uniform(0.3, 4.0)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=at)
                child.kill()
                child.wait()
                _next_command_reclaims(d / "probe", d / "tmp")
                why = f"volumes build killed after {at:.2f} s (IOTUNE_KILL_SEED={seed})"
                assert not os.path.ismount(d / "mnt") and not (d / "mnt").exists(), why
                assert knob.read_text().strip() == before, why
                assert member in _loops() and foreign.intact(), why
                assert left_behind(tmp_path, [child.pid], foreign, (tmp_path / "member",), (member,)) == [], why
        finally:
            subprocess.run(["losetup", "-d", member], check=False)
