"""fs.mountinfo: the one mountinfo parser, on lines as the kernel
writes them (octal escapes in the path fields, optional fields before the
lone "-"), and on a real mount point whose name needs every escape."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from iotune.fs import mountinfo
from iotune.fs.mountinfo import MountEntry, parse, unescape

from tests.conftest import needs_root_for

NASTY = "a b\tc\nd\\e"                           # space, tab, newline, backslash
ESCAPED = r"a\040b\011c\012d\134e"


def test_every_escape_the_kernel_writes_is_undone() -> None:
    assert unescape(ESCAPED) == NASTY
    assert unescape(ESCAPED.encode()) == NASTY
    assert unescape(r"plain\x") == r"plain\x"                 # not an escape: left alone
    assert unescape(r"\1234") == "S4"                         # three digits only
    assert unescape("caf\\303\\251") == "café"                # escaped bytes of one UTF-8 character
    assert unescape(b"\xff") == os.fsdecode(b"\xff")          # not UTF-8: as os.fsdecode gives it


def test_a_line_with_optional_fields_and_escaped_paths() -> None:
    text = (f"36 35 98:0 /sub{ESCAPED} /mnt/{ESCAPED} rw,noatime master:1 shared:7 - ext4 /dev/sd\\040a "
            f"rw,errors=continue\n"
            "50 36 0:51 / /run rw - tmpfs tmpfs\n"               # no superblock options
            "garbage line\n")
    assert parse(text) == parse(text.encode()) == [
        MountEntry("98:0", f"/sub{NASTY}", f"/mnt/{NASTY}", ("rw", "noatime"), "ext4", "/dev/sd a",
                   ("rw", "errors=continue")),
        MountEntry("0:51", "/", "/run", ("rw",), "tmpfs", "tmpfs", ()),
    ]


@needs_root_for("mount -t tmpfs")
def test_a_real_mount_point_with_every_escape_is_read_back(tmp_path: Path) -> None:
    where = tmp_path / NASTY
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "iotune-test", str(where)], check=True)
    try:
        [entry] = [m for m in mountinfo.read() if m.mount_point == str(where)]
        raw = Path("/proc/self/mountinfo").read_bytes()
        dev = os.stat(where).st_dev
    finally:
        subprocess.run(["umount", str(where)], check=True)
    assert (entry.fstype, entry.source, entry.number) == ("tmpfs", "iotune-test", f"{os.major(dev)}:{os.minor(dev)}")
    assert str(tmp_path).encode() + b"/" + ESCAPED.encode() in raw    # the kernel did escape it
    assert str(where) not in {m.mount_point for m in mountinfo.read()}


def test_read_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        mountinfo.read(tmp_path / "absent")
