"""The ledger's undo recipes (ledger.py), one per kind of thing iotune
makes: how to tell that a recorded one is still there, how to undo it from
its recorded facts alone (in another process, after its maker was killed), and how to
name it to the user. Every undo acts only on what the facts identify: a
loop device over our image (by path, or device and inode), a mount on our
directory, a cgroup we named, a process by pid *and* start time."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..fs import mountinfo
from .proc import kill_session

STOP_TIMEOUT_S = 5.0


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22); None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Kind:
    """How to tell that a recorded resource is still there, undo it, and name it."""

    present: Callable[[dict[str, str]], bool]
    undo: Callable[[dict[str, str]], object]
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
        time.sleep(0.1)                                  # each look runs losetup


def unmount(target: str | os.PathLike[str], remove_dir: bool, attempts: int = 20) -> None:
    """Unmount `target` (absolute, symlinks resolved: as mountinfo lists it),
    waiting out processes that are still closing files there (killed
    children finishing in-flight I/O); a last resort detaches it lazily so
    nothing stays mounted. Then, with `remove_dir`, remove the empty mount
    point."""
    for _ in range(attempts):
        if not mountinfo.is_mount_point(target):
            break
        if subprocess.run(["umount", os.fspath(target)], capture_output=True).returncode == 0:
            break
        time.sleep(0.25)
    else:
        subprocess.run(["umount", "-l", os.fspath(target)], capture_output=True)
    if remove_dir:
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


def remove_cgroup(cg: Path, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Move stragglers to the root cgroup, then remove `cg`; a process that
    is just exiting can keep it busy for a moment, so retry until
    `timeout_s`, then raise the last OSError."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (cg.parent / "cgroup.procs").write_text(pid)
        try:
            cg.rmdir()
            return
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
    """Never empty our own or the machine's namespace, whatever a record says
    (init's may be unreadable, as in a sandbox: then only ours is known)."""
    ours = set()
    for who in ("self", "1"):
        with contextlib.suppress(OSError):
            ours.add(os.readlink(f"/proc/{who}/ns/mnt"))
    return bool(ours) and ns not in ours


def empty_namespace(ns: str, term_s: float = 0.0, timeout_s: float = STOP_TIMEOUT_S,
                    between: Callable[[], object] = lambda: None) -> list[int]:
    """Signal every process in mount namespace `ns` until none is left:
    SIGTERM for `term_s`, then SIGKILL (the namespace, and its hold on
    mounts, goes with the last of them). Calls `between` after each round
    (to reap a child); returns the pids still there after `timeout_s`."""
    start = time.monotonic()
    while _foreign_namespace(ns) and (pids := namespace_pids(ns)):
        late = time.monotonic() - start
        if late > timeout_s:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if late >= term_s else signal.SIGTERM)
        time.sleep(0.05)
        between()
    return []


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
    "mount": Kind(lambda f: mountinfo.is_mount_point(f["target"]),
                  lambda f: unmount(f["target"], remove_dir=bool(f.get("rmdir"))), lambda f: f"mount {f['target']}"),
    "cgroup": Kind(lambda f: os.path.isdir(f["path"]), lambda f: remove_cgroup(Path(f["path"])), lambda f: f"blkio cgroup {f['path']}"),
    "process": Kind(_process_alive, _stop_process, lambda f: f"process {f['pid']} ({f.get('what', '?')})"),
    "namespace": Kind(lambda f: _foreign_namespace(f["ns"]) and bool(namespace_pids(f["ns"])),
                      lambda f: empty_namespace(f["ns"]),
                      lambda f: f"processes of mount namespace {f['ns']} ({f.get('what', '?')})"),
    "knob": Kind(_knob_differs, _restore_knob, lambda f: f"{f['path']} set from {f['old']!r}"),
    "md": Kind(lambda f: Path("/sys/block", Path(f["device"]).name).exists(), _stop_md,
               lambda f: f"md array {f['device']}"),
}
