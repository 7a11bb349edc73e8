"""cgroup v1 blkio: throttled cgroups (bandwidth and IOPS caps per device,
for the processes put in them), and running a child inside one. Shared by
volumes/, sweep/ and trace/."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from ..errors import IotuneError, PrivilegeError
from . import undo
from .ledger import note

log = logging.getLogger(__name__)

BLKIO = Path("/sys/fs/cgroup/blkio")
REMOVE_TIMEOUT_S = 2.0


class Throttle(NamedTuple):
    """Caps on one device, as blkio applies them; 0 means no cap of that kind."""

    device: str            # the device number, 'MAJ:MIN'
    read_bps: int = 0
    write_bps: int = 0
    read_iops: int = 0
    write_iops: int = 0


def _join(cgroup: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))


def join_cgroup_preexec(cgroup: str | os.PathLike[str] | None) -> Callable[[], None] | None:
    """A subprocess preexec_fn that moves the child into `cgroup` before it
    execs, so all of its I/O is governed by it (None: no cgroup)."""
    return functools.partial(_join, os.fspath(cgroup)) if cgroup else None


@contextlib.contextmanager
def blkio_cgroup(name_hint: str, limits: Iterable[Throttle | tuple[str, int, int, int, int]]) -> Iterator[Path]:
    """A fresh blkio cgroup, /sys/fs/cgroup/blkio/iotune-<pid>-<name_hint>,
    with each throttle set; yields its path. On exit (error and Ctrl-C
    included) processes still in it are moved to the root cgroup and it is
    removed."""
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        raise IotuneError(f"cgroup v1 blkio throttling is not available ({BLKIO}): "
                          f"run uncapped (a cap of 0) or on a kernel with CONFIG_BLK_DEV_THROTTLING")
    with contextlib.ExitStack() as stack:
        cg = _make(name_hint)
        note(stack, "cgroup", path=cg)        # after: the name was free until mkdir took it
        stack.callback(remove_cgroup, cg)
        for limit in limits:
            _throttle(cg, Throttle(*limit))
        yield cg


def _make(name_hint: str) -> Path:
    base = f"iotune-{os.getpid()}-{name_hint}"
    for n in range(100):
        cg = BLKIO / (base if n == 0 else f"{base}-{n}")
        try:
            cg.mkdir()
            return cg
        except FileExistsError:
            continue
        except PermissionError:
            raise PrivilegeError(f"cannot create a blkio cgroup in {BLKIO}: run as root") from None
    raise IotuneError(f"cannot find a free blkio cgroup name for {base} in {BLKIO}: remove stale iotune-* ones")


def _throttle(cg: Path, limit: Throttle) -> None:
    knobs = {"read_bps_device": limit.read_bps, "write_bps_device": limit.write_bps,
             "read_iops_device": limit.read_iops, "write_iops_device": limit.write_iops}
    for knob, value in knobs.items():
        if value:
            try:
                (cg / f"blkio.throttle.{knob}").write_text(f"{limit.device} {int(value)}\n")
            except OSError as e:
                raise IotuneError(f"cannot set blkio.throttle.{knob} to {value} for device {limit.device}: "
                                  f"{e.strerror}; check that {limit.device} is a block device") from None


def remove_cgroup(cg: Path) -> None:
    """Move stragglers to the root cgroup, then remove `cg` (retried
    briefly: a process that is just exiting can keep it busy); a cgroup that
    stays busy is named in a warning (the ledger keeps it for later)."""
    try:
        undo.remove_cgroup(cg, REMOVE_TIMEOUT_S)
    except OSError as e:
        log.warning("could not remove the cgroup %s: %s", cg, e.strerror)
