"""A drive's writeback limit (iotune.host.writeback): set for a while on the
loop device under a directory, and put back; refused where a filesystem
has no backing device of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotune.errors import UsageError
from iotune.host.writeback import bdi_of, dirty_limit

from tests.conftest import ext4_mount, needs_root


@needs_root
def test_the_limit_holds_inside_the_block_and_is_put_back(tmp_path: Path) -> None:
    with ext4_mount(tmp_path, 64 << 20) as mnt:
        bdi = bdi_of(str(mnt))
        assert bdi is not None and bdi.name.startswith("7:")         # the loop device's own
        names = ("max_ratio_fine", "max_ratio", "strict_limit")
        before = [(bdi / n).read_text() for n in names]
        with dirty_limit(str(mnt), 32 << 20):
            assert int((bdi / "max_bytes").read_text()) <= 32 << 20 and (bdi / "strict_limit").read_text() == "1\n"
        assert [(bdi / n).read_text() for n in names] == before
        with pytest.raises(RuntimeError), dirty_limit(str(mnt), 16 << 20):
            raise RuntimeError("a trial that fails")
        assert [(bdi / n).read_text() for n in names] == before


def test_a_filesystem_without_its_own_backing_device_is_refused() -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("needs /dev/shm (tmpfs)")
    assert bdi_of("/dev/shm") is None
    with pytest.raises(UsageError, match="no backing device of its own"), dirty_limit("/dev/shm", 1 << 20):
        pass
    with dirty_limit("/dev/shm", None):                                # no limit asked: nothing to do
        pass
