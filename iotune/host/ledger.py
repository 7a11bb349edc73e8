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
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .undo import KINDS, STOP_TIMEOUT_S, start_ticks

log = logging.getLogger(__name__)

STATE_DIR = Path("/run/iotune/owned")
OWNER_ENV = "IOTUNE_OWNER"


# -- owners -----------------------------------------------------------------

def boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    return "noboot"


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
        done = reclaim()
        if done:       # said once, on stderr: what this command cleaned up before making anything
            log.warning("reclaimed what killed iotune runs left: %s", "; ".join(done))
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


def opened_ledger() -> Ledger | None:
    """This process's ledger if it has made something already, else None.
    `iotune trace` of a user's job opens none: a job is the user's, and must
    not carry IOTUNE_OWNER (a reclaim would kill it)."""
    return _OPEN.get(os.getpid())


def note(stack: contextlib.ExitStack, kind: str, **facts: str | int | os.PathLike[str]) -> Entry | None:
    """Record a resource (see the module's docstring for before or after
    making it) and schedule dropping the record on `stack`: register the
    resource's own undo on the stack *after* this, so it runs first."""
    book = ledger()
    if book is None:
        return None
    entry = book.write(kind, {k: os.fspath(v) if isinstance(v, os.PathLike) else str(v) for k, v in facts.items()})
    stack.callback(entry.settle)
    return entry


def temp_dir(stack: contextlib.ExitStack, prefix: str, parent: Path | None = None) -> Path:
    """A fresh temporary directory (in `parent`, default $TMPDIR), recorded,
    and removed with what is in it when `stack` closes."""
    made = Path(tempfile.mkdtemp(prefix=prefix, dir=parent)).resolve()
    note(stack, "dir", path=made)
    stack.callback(shutil.rmtree, made, True)
    return made


def private_tmp(env: dict[str, str], directory: Path) -> dict[str, str]:
    """`env` with TMPDIR at `directory` (made here), a directory inside one
    already recorded: what the children iotune starts write to temporary
    files (DeepSpeed's compiler probes, torch's) is removed with it, also
    after a hard kill in the middle of a compile."""
    directory.mkdir(exist_ok=True)
    return {**env, "TMPDIR": str(directory)}


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
    _settle_deferred(d)
    if not any(d.glob("*.json")):
        shutil.rmtree(d, ignore_errors=True)
    return done


def _undo(entries: list[Entry]) -> list[str]:
    """Undo each present entry in order; drop the records of what is gone."""
    done: list[str] = []
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


def _settle_deferred(d: Path) -> None:
    """Drop the records of releases the kernel completes later (a loop
    device freed once its lazily unmounted filesystem lets go), waiting for
    them up to STOP_TIMEOUT_S; what is still there then stays recorded."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while True:
        left = read_entries(d)
        for entry in left:
            entry.settle()
        if not any(d.glob("*.json")) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(start_ticks(p) is not None for p in pids):
        time.sleep(0.02)
