"""The one reader of /proc/<pid>/mountinfo (proc_pid_mountinfo(5)), and
the mount queries built on it (mount_points, is_mount_point).

A line is: mount ID, parent ID, major:minor, root, mount point, per-mount
options, optional fields (zero or more), a lone "-", filesystem type, mount
source, superblock options. The kernel writes space, tab, newline and
backslash in the path fields as three-digit octal escapes (\\040, \\011,
\\012, \\134); fstab uses the same escapes, so `unescape` serves both."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

_OCTAL = re.compile(rb"\\([0-3][0-7]{2})")      # one byte: \000 to \377


@dataclass(frozen=True)
class MountEntry:
    """One mountinfo line, its path fields unescaped."""

    number: str                          # "major:minor" of the filesystem (what stat's st_dev gives)
    root: str                            # the directory of the filesystem mounted here
    mount_point: str
    options: tuple[str, ...]             # per-mount options
    fstype: str
    source: str
    super_options: tuple[str, ...]       # superblock options


def unescape(field: str | bytes) -> str:
    """A mountinfo (or fstab) field with its octal escapes undone. Bytes that
    are not UTF-8 come back as os.fsdecode gives them."""
    raw = os.fsencode(field) if isinstance(field, str) else field
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), raw))


def parse(text: str | bytes) -> list[MountEntry]:
    """Every well-formed line of a mountinfo file's text; others are skipped."""
    raw = os.fsencode(text) if isinstance(text, str) else text
    entries = []
    for line in raw.splitlines():
        fields = line.split()
        try:
            sep = fields.index(b"-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3:
            continue
        fstype, source = fields[sep + 1], fields[sep + 2]
        supers = fields[sep + 3] if len(fields) > sep + 3 else b""
        entries.append(MountEntry(os.fsdecode(fields[2]), unescape(fields[3]), unescape(fields[4]),
                                  tuple(os.fsdecode(fields[5]).split(",")), unescape(fstype), unescape(source),
                                  tuple(os.fsdecode(supers).split(",")) if supers else ()))
    return entries


def read(path: str | os.PathLike[str] = MOUNTINFO) -> list[MountEntry]:
    """The mounts listed in `path` (this process's namespace by default;
    /proc/PID/mountinfo for another's). OSError propagates."""
    with open(path, "rb") as fh:
        return parse(fh.read())


def mount_points(path: str | os.PathLike[str] = MOUNTINFO) -> set[str]:
    """Every mount point listed in `path` (this namespace by default), escapes
    undone; empty when it cannot be read."""
    try:
        return {m.mount_point for m in read(path)}
    except OSError:
        return set()


def is_mount_point(path: str | os.PathLike[str]) -> bool:
    """Whether `path` (absolute, symlinks resolved) is a mount point here,
    from mountinfo alone: os.path.ismount stats it, which can hang on a
    stuck FUSE mount."""
    return os.fspath(path) in mount_points()
