"""DeepSpeed op-build locks in torch's JIT extension cache.

torch builds DeepSpeed's ops (async_io, cpu_adam) on first load and guards
each build with a lock file (<root>/<op>/lock). A build killed midway
leaves its lock behind, and every later load of that op waits on it
forever, silently: a sweep or a training job that seems to hang. `iotune
doctor --ds-config` reports such locks (and removes them with --fix); the
sweep and `iotune trace` refuse to start on one, and the sweep removes the
lock of a build that its own time limit stopped. While a job runs, LockWatch finds a
lock that appears with nobody holding or building it (LOCK_HANG_NOTE says
what to tell the user).

Who holds a lock: torch's FileBaton creates the file with
os.open(O_CREAT | O_EXCL) and keeps that descriptor open until it removes
the file, so the process building has the lock open (`holders`), and ninja
and the compilers it runs work in the op's directory (`builders`). A lock
with neither is orphaned: its build died. What this cannot see: a build on
another machine (or container) sharing the same cache directory."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import IotuneError

STALE_LOCK_AFTER_S = 600.0      # a lock this old with nobody building is left over
SETTLE_S = 1.0                  # an orphaned lock must be seen twice this far apart (and be the same file)


@dataclass(frozen=True)
class BuildLock:
    path: str
    age_s: float
    builders: tuple[int, ...]          # pids working in the op's build directory (a build in progress)
    holders: tuple[int, ...] = ()      # pids with the lock file open (torch's FileBaton, until it releases)
    identity: tuple[int, int] = (0, 0)   # (inode, mtime ns): a new lock at the same path is another lock

    @property
    def op(self) -> str:
        return Path(self.path).parent.name

    @property
    def orphaned(self) -> bool:
        """Nobody on this machine holds it or builds under it: its build died."""
        return not self.builders and not self.holders

    @property
    def stale(self) -> bool:
        return self.orphaned and self.age_s > STALE_LOCK_AFTER_S


def extension_roots(env: dict[str, str] | None = None) -> list[Path]:
    """Where torch builds DeepSpeed's ops: $TORCH_EXTENSIONS_DIR/<op>, else
    ~/.cache/torch_extensions/<py3XX_cpu|cuXXX>/<op> (cpp_extension._get_build_directory)."""
    where = dict(os.environ if env is None else env)
    if where.get("TORCH_EXTENSIONS_DIR"):
        return [Path(where["TORCH_EXTENSIONS_DIR"])]
    home = Path(where["HOME"]) if where.get("HOME") else Path.home()    # a job run as another user: its HOME
    cache = Path(where.get("XDG_CACHE_HOME") or home / ".cache") / "torch_extensions"
    try:
        return sorted(p for p in cache.glob("py*") if p.is_dir())
    except OSError:                # another user's cache this process may not read: no lock it can see
        return []


def build_locks(roots: list[Path], now: float | None = None) -> list[BuildLock]:
    """torch's FileBaton locks (<root>/<op>/lock) and the processes whose
    working directory is that op's build directory (ninja runs there)."""
    now = time.time() if now is None else now
    found = []
    for root in roots:
        try:
            locks = sorted(root.glob("*/lock"))
        except OSError:               # a cache this process may not read
            continue
        for lock in locks:
            try:
                st = lock.stat()
            except OSError:
                continue
            found.append((lock, now - st.st_mtime, (st.st_ino, st.st_mtime_ns)))
    if not found:
        return []
    holders = pids_holding([os.path.realpath(lock) for lock, _, _ in found])
    return [BuildLock(str(lock), age, tuple(pids_in(lock.parent)), tuple(holders.get(os.path.realpath(lock), ())),
                      ident) for lock, age, ident in found]


def stale_locks(env: dict[str, str] | None = None) -> list[BuildLock]:
    return [lk for lk in build_locks(extension_roots(env)) if lk.stale]


def stale_lock_problem(env: dict[str, str] | None = None) -> str | None:
    """What to tell a user about to load DeepSpeed's ops, if a left-over lock would hang them; else None."""
    stale = stale_locks(env)
    if not stale:
        return None
    paths = " ".join(lk.path for lk in stale)
    return (f"DeepSpeed op build lock {stale[0].path} is {stale[0].age_s / 60:.0f} min old and no build is "
            f"running: a build killed midway left it, and every load of {stale[0].op} would wait on it "
            f"forever. Remove it (`rm {paths}`, or `iotune doctor --ds-config CONFIG --fix`) and run again")


LOCK_HANG_NOTE = (
    "{path} is a DeepSpeed op build lock that no process here holds or builds under: torch creates it while "
    "it builds the {op} op and removes it when the build ends, so a build killed midway left it behind, and "
    "every process that loads {op} waits for it to disappear, forever and silently. {context}Remove it: "
    "`rm {path}` (a job waiting on it then goes on, and torch builds {op} again), or `iotune doctor "
    "--ds-config CONFIG --fix` once it is {stale_min} min old")


def hang_note(lock: BuildLock, context: str = "") -> str:
    """What a lock nobody holds does to a job, and the fix (`context`, if
    given, is a sentence about the job, put before the fix)."""
    return LOCK_HANG_NOTE.format(path=lock.path, op=lock.op, context=f"{context} " if context else "",
                                 stale_min=f"{STALE_LOCK_AFTER_S / 60:.0f}")


class LockWatch:
    """Finds, while a job runs, op-build locks it would wait on forever.

    poll() (call it as often as convenient; it looks at most every
    `interval_s`) returns the locks newly found orphaned: the same file
    (inode and mtime) seen with no holder and no builder on two looks at
    least `settle_s` apart, whatever its age, so a build killed during the
    job counts. Each lock is returned once (a new lock at the same path is
    another lock); `said` are locks already named to the user."""

    def __init__(self, env: dict[str, str] | None = None, settle_s: float = SETTLE_S,
                 interval_s: float = 0.5, said: tuple[BuildLock, ...] = ()) -> None:
        self.env, self.settle_s, self.interval_s = env, settle_s, interval_s
        self.said: set[tuple[str, tuple[int, int]]] = {(lk.path, lk.identity) for lk in said}
        self._first: dict[str, tuple[tuple[int, int], float]] = {}    # path -> (identity, first seen orphaned)
        self._last = float("-inf")

    def poll(self, now: float | None = None) -> list[BuildLock]:
        now = time.monotonic() if now is None else now
        if now - self._last < self.interval_s:
            return []
        self._last = now
        orphans = {lk.path: lk for lk in build_locks(extension_roots(self.env)) if lk.orphaned}
        self._first = {p: seen for p, seen in self._first.items()
                       if p in orphans and orphans[p].identity == seen[0]}
        found = []
        for path, lk in orphans.items():
            ident, since = self._first.setdefault(path, (lk.identity, now))
            if now - since >= self.settle_s and (path, ident) not in self.said:
                self.said.add((path, ident))
                found.append(lk)
        return found


class BuildLockHang(IotuneError):
    """A job iotune runs waits on an orphaned op-build lock (raised by a
    LockWatch's caller to stop waiting for it); the message names the fix."""

    def __init__(self, lock: BuildLock, context: str = "") -> None:
        super().__init__(hang_note(lock, context))
        self.lock = lock


def hang_guard(env: dict[str, str] | None, what: str) -> Callable[[], None]:
    """A `watch` for proc.run_in_own_group / WarmStarter.run: raises
    BuildLockHang once a build lock nobody holds or builds under is seen
    (`what`: the run, named in the message)."""
    watch = LockWatch(env)
    t0 = time.monotonic()

    def check() -> None:
        for lock in watch.poll():
            raise BuildLockHang(lock, f"{what} had run {time.monotonic() - t0:.0f} s: it waits on this lock, "
                                      f"as would every later run.")

    return check


def release_locks_left_since(since: float, env: dict[str, str] | None = None,
                             settle_s: float = 2.0) -> list[str]:
    """Remove the build locks a run that iotune just stopped left behind;
    the paths removed.

    Called after a time limit killed such a run (its whole session): a lock
    created at or after `since` (the run's start) with nobody building under
    it, twice `settle_s` apart, belongs to the killed build. A build of
    another job started in the same window is running ninja in its build
    directory, so it is seen and its lock kept. Older locks are never
    touched here (`iotune doctor --fix` handles those, with the user's say)."""
    def candidates() -> set[str]:
        made_after = time.time() - since + 1.0          # the lock's age, at most (1 s of clock slack)
        return {lk.path for lk in build_locks(extension_roots(env)) if lk.orphaned and lk.age_s <= made_after}

    first = candidates()
    if not first:
        return []
    time.sleep(settle_s)
    removed = []
    for path in sorted(first & candidates()):
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def pids_holding(paths: list[str]) -> dict[str, list[int]]:
    """path -> the processes with that file open (from /proc/PID/fd; only
    the processes this one may inspect: all of them as root)."""
    want = set(paths)
    found: dict[str, list[int]] = {}
    for pid, target in open_files():
        if target in want and pid not in found.get(target, ()):
            found.setdefault(target, []).append(pid)
    return found


def open_files() -> Iterator[tuple[int, str]]:
    """(pid, path) for every file descriptor of every process this one may
    inspect (/proc/PID/fd)."""
    for pid in all_pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                yield pid, os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue


def pids_in(directory: Path) -> list[int]:
    """Processes whose current directory is `directory` or below it."""
    want = os.path.realpath(directory)
    found = []
    for pid in all_pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == want or cwd.startswith(want + "/"):
            found.append(pid)
    return found


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]
