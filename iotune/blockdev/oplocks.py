"""DeepSpeed op-build locks in torch's JIT extension cache.

torch builds DeepSpeed's ops (async_io, cpu_adam) on first load and guards
each build with a lock file (<root>/<op>/lock). A build killed midway
leaves its lock behind, and every later load of that op waits on it
forever, silently: a sweep or a training job that seems to hang. `iotune
doctor --ds-config` reports such locks (and removes them with --fix); the
sweep refuses to start on one, and removes the lock of a build that its own
time limit stopped."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

STALE_LOCK_AFTER_S = 600.0      # a lock this old with nobody building is left over


@dataclass(frozen=True)
class BuildLock:
    path: str
    age_s: float
    builders: tuple[int, ...]          # pids working in the op's build directory (a build in progress)

    @property
    def op(self) -> str:
        return Path(self.path).parent.name

    @property
    def stale(self) -> bool:
        return not self.builders and self.age_s > STALE_LOCK_AFTER_S


def extension_roots(env: dict[str, str] | None = None) -> list[Path]:
    """Where torch builds DeepSpeed's ops: $TORCH_EXTENSIONS_DIR/<op>, else
    ~/.cache/torch_extensions/<py3XX_cpu|cuXXX>/<op> (cpp_extension._get_build_directory)."""
    where = dict(os.environ if env is None else env)
    if where.get("TORCH_EXTENSIONS_DIR"):
        return [Path(where["TORCH_EXTENSIONS_DIR"])]
    cache = Path(where.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    return sorted(p for p in cache.glob("py*") if p.is_dir())


def build_locks(roots: list[Path], now: float | None = None) -> list[BuildLock]:
    """torch's FileBaton locks (<root>/<op>/lock) and the processes whose
    working directory is that op's build directory (ninja runs there)."""
    now = time.time() if now is None else now
    out = []
    for root in roots:
        for lock in sorted(root.glob("*/lock")):
            try:
                age = now - lock.stat().st_mtime
            except OSError:
                continue
            out.append(BuildLock(str(lock), age, tuple(pids_in(lock.parent))))
    return out


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
        return {lk.path for lk in build_locks(extension_roots(env)) if not lk.builders and lk.age_s <= made_after}

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
