"""What iotune made, and which process made it: a ledger kept outside the
process, so that a maker killed with SIGKILL (the OOM killer, a scheduler's
kill after its grace period) leaves nothing the next iotune command cannot
find and undo.

Ctrl-C and SIGTERM unwind the makers' ExitStacks; SIGKILL cannot be caught,
so every resource is also written down here, with its owner:

    STATE_DIR/<pid>-<start>-<boot>/       one directory per owner process
        <seq>-<kind>.json                 one record per resource, numbered in order

An owner is gone when no process of this boot has its pid and start time
(a pid alone can be reused). The first record a process writes opens its
ledger, which first reclaims what gone owners left (so every command that
makes something starts by cleaning up after killed ones), and exports
IOTUNE_OWNER=<owner> to the children it starts from then on: trials,
training runs and daemons are found by their environment.

A record is written *before* the resource is made where its name is ours
in advance (a loop device over our own image, a mount on our own directory,
a queue setting with the value it had), and right *after* where a name
could collide with someone else's (files, directories, cgroups, daemons):
a record must never name a thing iotune did not make. After its undo ran, a
record is removed only if the resource is really gone; otherwise it stays
for `iotune doctor`, which lists what gone owners left, and `doctor --fix`,
which reclaims it.

Reclaiming an owner: kill its processes (by IOTUNE_OWNER) except the daemons
it recorded, then undo its records newest first (a filesystem is unmounted
before its loop device is detached, the FUSE daemon under that device is
stopped after), each only if it is still there and still ours."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .proc import kill_session

log = logging.getLogger(__name__)

STATE_DIR = Path("/run/iotune/owned")
OWNER_ENV = "IOTUNE_OWNER"
STOP_TIMEOUT_S = 5.0


# -- owners -----------------------------------------------------------------

def boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    return "noboot"


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22); None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def owner_key(pid: int) -> str | None:
    """The ledger's name for the live process `pid`: pid, start time, boot."""
    start = start_ticks(pid)
    return None if start is None else f"{pid}-{start}-{boot_id()}"


def owner_alive(key: str) -> bool:
    try:
        pid, start, boot = key.split("-")
        return boot == boot_id() and start_ticks(int(pid)) == int(start)
    except ValueError:
        return False


# -- kinds of resources -----------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """How to tell that a recorded resource is still there, undo it, and name it."""

    present: Callable[[dict[str, str]], bool]
    undo: Callable[[dict[str, str]], None]
    describe: Callable[[dict[str, str]], str]


def _loops_over(facts: dict[str, str]) -> list[str]:
    """Loop devices over the recorded image: by its path, or by its device
    and inode (a file on a FUSE mount that was detached under the loop device
    is shown by the kernel as a path relative to that mount, "/disk")."""
    out = subprocess.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE,BACK-INO,BACK-MAJ:MIN"],
                         capture_output=True, text=True, check=False).stdout
    try:
        loops = json.loads(out)["loopdevices"] if out.strip() else []
    except (ValueError, KeyError):
        return []
    ident = (facts.get("dev"), facts.get("ino"))
    found = []
    for lo in loops:
        back = str(lo.get("back-file") or "").removesuffix(" (deleted)")
        same_file = ident != (None, None) and (str(lo.get("back-maj:min", "")).strip(), str(lo.get("back-ino"))) == ident
        if back == facts["backing"] or same_file:
            found.append(str(lo["name"]))
    return sorted(found)


def loop_identity(image: Path) -> dict[str, str]:
    """What identifies loop devices over `image`: its path, device and inode."""
    st = image.stat()
    return {"backing": str(image.resolve()), "dev": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
            "ino": str(st.st_ino)}


def _detach(facts: dict[str, str]) -> None:
    for loop in _loops_over(facts):
        subprocess.run(["losetup", "-d", loop], capture_output=True, check=False)
    deadline = time.monotonic() + STOP_TIMEOUT_S        # the kernel defers a detach while the device is open
    while _loops_over(facts) and time.monotonic() < deadline:
        time.sleep(0.02)


def mount_points() -> set[str]:
    """Mount points in this mount namespace (mountinfo's octal escapes undone)."""
    with open("/proc/self/mountinfo", "rb") as fh:
        return {_unescape(line.split()[4]) for line in fh if len(line.split()) > 4}


def _unescape(field_: bytes) -> str:
    out, i = bytearray(), 0
    while i < len(field_):
        if field_[i:i + 1] == b"\\" and field_[i + 1:i + 4].isdigit():
            out.append(int(field_[i + 1:i + 4], 8))
            i += 4
        else:
            out += field_[i:i + 1]
            i += 1
    return os.fsdecode(bytes(out))


def _unmount(facts: dict[str, str]) -> None:
    target = facts["target"]
    for _ in range(20):
        if target not in mount_points():
            break
        if subprocess.run(["umount", target], capture_output=True).returncode == 0:
            break
        time.sleep(0.25)
    else:
        subprocess.run(["umount", "-l", target], capture_output=True)
    if facts.get("rmdir"):
        with contextlib.suppress(OSError):
            os.rmdir(target)


def _remove_tree(path: Path) -> None:
    """`path` and what is in it, never crossing into another filesystem
    (a mount left inside is skipped, not emptied)."""
    try:
        top = path.lstat()
    except FileNotFoundError:
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            sub = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if os.path.islink(sub):
                    os.unlink(sub)
                elif os.lstat(sub).st_dev == top.st_dev and not os.path.ismount(sub):
                    os.rmdir(sub)
    with contextlib.suppress(OSError):
        path.rmdir()


def _remove_cgroup(facts: dict[str, str]) -> None:
    cg = Path(facts["path"])
    root = cg.parent
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while cg.exists():
        with contextlib.suppress(OSError):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
        try:
            cg.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _process_alive(facts: dict[str, str]) -> bool:
    return start_ticks(int(facts["pid"])) == int(facts["start"])


def _stop_process(facts: dict[str, str]) -> None:
    """SIGTERM (a FUSE daemon unmounts and exits), then SIGKILL its session."""
    pid = int(facts["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _process_alive(facts) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _process_alive(facts):
        kill_session(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def namespace_pids(ns: str) -> list[int]:
    """Every process whose mount namespace is `ns` ("mnt:[...]")."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*/ns/mnt"):
        with contextlib.suppress(OSError):
            if os.readlink(entry) == ns:
                pids.append(int(entry.parts[2]))
    return pids


def _foreign_namespace(ns: str) -> bool:
    """Never empty our own or the machine's namespace, whatever a record says."""
    with contextlib.suppress(OSError):
        return ns not in (os.readlink("/proc/self/ns/mnt"), os.readlink("/proc/1/ns/mnt"))
    return False


def _empty_namespace(facts: dict[str, str]) -> None:
    ns = facts["ns"]
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _foreign_namespace(ns) and (pids := namespace_pids(ns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _knob_differs(facts: dict[str, str]) -> bool:
    try:
        now = Path(facts["path"]).read_text().strip()
    except OSError:
        return False
    if "[" in now:                                   # a scheduler list: the chosen one is bracketed
        now = now[now.index("[") + 1:now.index("]")]
    return now != facts["old"]


def _restore_knob(facts: dict[str, str]) -> None:
    Path(facts["path"]).write_text(facts["old"])


def _stop_md(facts: dict[str, str]) -> None:
    subprocess.run(["mdadm", "--stop", facts["device"]], capture_output=True, check=False)


KINDS: dict[str, Kind] = {
    "file": Kind(lambda f: os.path.lexists(f["path"]), lambda f: Path(f["path"]).unlink(missing_ok=True),
                 lambda f: f"file {f['path']}"),
    "dir": Kind(lambda f: os.path.lexists(f["path"]), lambda f: _remove_tree(Path(f["path"])),
                lambda f: f"directory {f['path']}"),
    "loop": Kind(lambda f: bool(_loops_over(f)), _detach,
                 lambda f: f"loop device {', '.join(_loops_over(f)) or '-'} over {f['backing']}"),
    "mount": Kind(lambda f: f["target"] in mount_points(), _unmount, lambda f: f"mount {f['target']}"),
    "cgroup": Kind(lambda f: os.path.isdir(f["path"]), _remove_cgroup, lambda f: f"blkio cgroup {f['path']}"),
    "process": Kind(_process_alive, _stop_process, lambda f: f"process {f['pid']} ({f.get('what', '?')})"),
    "namespace": Kind(lambda f: _foreign_namespace(f["ns"]) and bool(namespace_pids(f["ns"])), _empty_namespace,
                      lambda f: f"processes of mount namespace {f['ns']} ({f.get('what', '?')})"),
    "knob": Kind(_knob_differs, _restore_knob, lambda f: f"{f['path']} set from {f['old']!r}"),
    "md": Kind(lambda f: Path("/sys/block", Path(f["device"]).name).exists(), _stop_md,
               lambda f: f"md array {f['device']}"),
}


# -- records ----------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One recorded resource: its file in the ledger (None: found by its
    name, not recorded), kind and facts."""

    path: Path | None
    kind: str
    facts: dict[str, str] = field(hash=False)

    @property
    def present(self) -> bool:
        try:
            return KINDS[self.kind].present(self.facts)
        except (OSError, KeyError, ValueError):
            return False

    def describe(self) -> str:
        try:
            return KINDS[self.kind].describe(self.facts)
        except (KeyError, ValueError):
            return f"{self.kind} {self.facts}"

    def undo(self) -> None:
        KINDS[self.kind].undo(self.facts)

    def settle(self) -> None:
        """Drop the record once the resource is gone (its maker undid it)."""
        if not self.present:
            self.drop()

    def drop(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def read_entries(owner_dir: Path) -> list[Entry]:
    """An owner's records, newest first."""
    out = []
    for path in owner_dir.glob("*.json"):
        try:
            doc = json.loads(path.read_text())
            out.append((int(path.name.split("-", 1)[0]), Entry(path, str(doc["kind"]),
                                                               {k: str(v) for k, v in doc["facts"].items()})))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return [e for _, e in sorted(out, key=lambda t: t[0], reverse=True)]


@dataclass
class Ledger:
    """This process's ledger (opened by its first record)."""

    directory: Path
    seq: int = 0

    def write(self, kind: str, facts: dict[str, str]) -> Entry:
        if kind not in KINDS:
            raise ValueError(f"unknown resource kind {kind}")
        self.seq += 1
        path = self.directory / f"{self.seq:05d}-{kind}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"kind": kind, "facts": facts, "at": time.time()}))
        os.replace(tmp, path)
        return Entry(path, kind, dict(facts))


_OPEN: dict[int, Ledger] = {}     # this process's ledger, by pid (a forked child opens its own)


def state_dir() -> Path:
    return Path(os.environ.get("IOTUNE_STATE_DIR") or STATE_DIR)


def ledger() -> Ledger | None:
    """This process's ledger, opened on first use: gone owners' leftovers are
    reclaimed first, and children started from now on carry IOTUNE_OWNER.
    None when the state directory cannot be written (not root): nothing is
    recorded then, as nothing can be made without root either."""
    pid = os.getpid()
    if pid in _OPEN:
        return _OPEN[pid]
    key = owner_key(pid)
    if key is None:
        return None
    try:
        reclaim()
        directory = state_dir() / key
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "owner.txt").write_text(" ".join(sys.argv) + "\n")
    except OSError as e:
        log.warning("cannot keep iotune's ledger in %s (%s): a hard kill would leave what this run makes",
                    state_dir(), e.strerror)
        return None
    _OPEN[pid] = Ledger(directory)
    os.environ[OWNER_ENV] = key
    atexit.register(_close, directory)
    return _OPEN[pid]


def _close(directory: Path) -> None:
    """At a normal exit: the owner's directory goes once nothing in it is recorded."""
    if not any(directory.glob("*.json")):
        shutil.rmtree(directory, ignore_errors=True)


def note(stack: contextlib.ExitStack, kind: str, **facts: str | int) -> Entry | None:
    """Record a resource (see the module's docstring for before or after
    making it) and schedule dropping the record on `stack`: register the
    resource's own undo on the stack *after* this, so it runs first."""
    book = ledger()
    if book is None:
        return None
    entry = book.write(kind, {k: str(v) for k, v in facts.items()})
    stack.callback(entry.settle)
    return entry


def note_process(stack: contextlib.ExitStack, pid: int, what: str) -> Entry | None:
    start = start_ticks(pid)
    if start is None:
        return None
    return note(stack, "process", pid=pid, start=start, what=what)


# -- what gone owners left, and reclaiming it -------------------------------

@dataclass(frozen=True)
class Leftovers:
    owner: str                 # the gone owner's key
    command: str               # what it was running
    entries: tuple[Entry, ...]     # records whose resource is still there
    pids: tuple[int, ...]          # its processes still running

    def lines(self) -> list[str]:
        procs = [f"process {pid} ({_comm(pid)})" for pid in self.pids]
        return procs + [e.describe() for e in self.entries]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def owned_pids(key: str) -> list[int]:
    """Processes whose environment says IOTUNE_OWNER=`key`."""
    want = f"{OWNER_ENV}={key}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if want in entry.read_bytes().split(b"\0"):
                found.append(int(entry.parent.name))
    me = os.getpid()
    return [p for p in found if p != me]


def gone_owners() -> list[Path]:
    root = state_dir()
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and not owner_alive(d.name))


def leftovers() -> list[Leftovers]:
    """What owners that are gone left behind (records of things still there, and processes)."""
    out = []
    for d in gone_owners():
        try:
            command = (d / "owner.txt").read_text().strip()
        except OSError:
            command = "?"
        entries = tuple(e for e in read_entries(d) if e.present)
        pids = tuple(owned_pids(d.name))
        out.append(Leftovers(d.name, command, entries, pids))
    return [lo for lo in out if lo.entries or lo.pids]


@contextlib.contextmanager
def _reclaim_lock() -> Iterator[None]:
    root = state_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".reclaim.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def reclaim() -> list[str]:
    """Undo what gone owners left; one line per thing undone. What cannot
    be undone stays recorded (and `iotune doctor` names it)."""
    done: list[str] = []
    with _reclaim_lock():
        for d in gone_owners():
            done += _reclaim_owner(d)
        done += _undo(unrecorded())
    return done


def _reclaim_owner(d: Path) -> list[str]:
    done = []
    entries = read_entries(d)
    daemons = {int(e.facts["pid"]) for e in entries if e.kind == "process"}
    for pid in owned_pids(d.name):
        if pid not in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                done.append(f"killed process {pid} ({_comm(pid)})")
    _wait_gone([p for p in owned_pids(d.name) if p not in daemons])
    done += _undo(entries)
    if not any(d.glob("*.json")):
        shutil.rmtree(d, ignore_errors=True)
    return done


def _undo(entries: list[Entry]) -> list[str]:
    """Undo each present entry in order; drop the records of what is gone."""
    done = []
    for entry in entries:
        if not entry.present:
            entry.drop()
            continue
        what = entry.describe()
        try:
            entry.undo()
        except OSError as e:
            log.warning("could not undo %s: %s", what, e.strerror)
        if entry.present:
            log.warning("%s is still there after undoing it", what)
            continue
        entry.drop()
        done.append(f"removed {what}")
    return done


# -- leftovers from before the ledger (iotune < 0.2), found by their names ---
# A scratch drive was iotune-scratch-*/iotune-drive-<pid>[-n].img, its loop
# device mounted on iotune-mnt-loopN beside it, its cap a cgroup
# iotune-<pid>-<hint>. The pid in the name says whose; a live pid is never touched.

def _pid_in(name: str, prefix: str) -> int | None:
    head = name.removeprefix(prefix).split("-", 1)[0].split(".", 1)[0]
    return int(head) if name.startswith(prefix) and head.isdigit() else None


def _dead(pid: int | None) -> bool:
    return pid is not None and start_ticks(pid) is None


def unrecorded(blkio: Path = Path("/sys/fs/cgroup/blkio")) -> list[Entry]:
    """Scratch drives and cgroups of dead iotune processes that no ledger
    names (made before iotune kept one), in the order to undo them."""
    recorded = {e.facts.get("path") or e.facts.get("backing") for d in _all_owner_dirs() for e in read_entries(d)}
    mounts, loops, files, cgroups = [], [], [], []
    for entry in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            backing = entry.read_text().strip().removesuffix(" (deleted)")
            image = Path(backing)
            if backing in recorded or not _dead(_pid_in(image.name, "iotune-drive-")):
                continue
            loops.append(Entry(None, "loop", {"backing": backing}))
            files.append(Entry(None, "file", {"path": backing}))
            mnt = image.parent / f"iotune-mnt-{entry.parent.parent.name}"
            mounts.append(Entry(None, "mount", {"target": str(mnt), "rmdir": "1"}))
            if image.parent.name.startswith("iotune-scratch-"):
                files.append(Entry(None, "dir", {"path": str(image.parent)}))
    for cg in sorted(blkio.glob("iotune-*")) if blkio.is_dir() else []:
        if cg.is_dir() and str(cg) not in recorded and _dead(_pid_in(cg.name, "iotune-")):
            cgroups.append(Entry(None, "cgroup", {"path": str(cg)}))
    return [e for e in mounts if e.present] + cgroups + loops + [e for e in files if e.present]


def _all_owner_dirs() -> list[Path]:
    root = state_dir()
    return sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(start_ticks(p) is not None for p in pids):
        time.sleep(0.02)
