"""Page-cache writeback of one drive: its backing-device (BDI) limit on dirty
pages, `/sys/class/bdi/MAJ:MIN/max_bytes` with `strict_limit` (Linux 6.2+),
set for a while and put back.

A buffered copy (DeepSpeed's copy of the offloaded tensors into a
checkpoint) returns as soon as its pages are dirty in RAM; with a limit, the
copying process is throttled to the drive's writeback once that many bytes
of the drive's pages are dirty, so more of the checkpoint is on the drive
when save_checkpoint returns and less writeback competes with the next
steps' swap I/O. Only the drive holding the directory is touched, never the
machine-wide vm.dirty_* settings.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import PrivilegeError, UsageError

BDI = Path("/sys/class/bdi")


def bdi_of(directory: str) -> Path | None:
    """The writeback settings of the drive holding `directory` (None: the
    filesystem has no backing device of its own, as tmpfs or btrfs's anonymous device)."""
    dev = os.stat(directory).st_dev
    path = BDI / f"{os.major(dev)}:{os.minor(dev)}"
    return path if (path / "max_bytes").exists() and (path / "strict_limit").exists() else None


@contextlib.contextmanager
def dirty_limit(directory: str, limit_bytes: int | None) -> Iterator[None]:
    """With `limit_bytes`, the drive holding `directory` keeps at most that
    many dirty bytes (strictly), until the block ends; None: nothing changes."""
    if limit_bytes is None:
        yield
        return
    bdi = bdi_of(directory)
    if bdi is None:
        raise UsageError(f"{directory}: its filesystem has no backing device of its own in {BDI}, so its "
                         f"writeback cannot be limited (tmpfs, btrfs): leave out the dirty-limit candidates")
    # the kernel keeps the limit as a ratio of the machine's dirty threshold (max_bytes is read back
    # from it, and moves with free memory): the ratio is what is put back, to the part per million
    ratio = "max_ratio_fine" if (bdi / "max_ratio_fine").exists() else "max_ratio"
    saved = {name: (bdi / name).read_text().strip() for name in (ratio, "strict_limit")}
    try:
        _write(bdi / "max_bytes", str(limit_bytes))
        _write(bdi / "strict_limit", "1")
        yield
    finally:
        for name in ("strict_limit", ratio):
            with contextlib.suppress(OSError):
                (bdi / name).write_text(saved[name])


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except PermissionError:
        raise PrivilegeError(f"cannot write {path}: limiting a drive's writeback needs root") from None
