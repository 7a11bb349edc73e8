"""Can a directory take O_DIRECT I/O? DeepSpeed's swapper (aio_handle) opens
every swap file with O_DIRECT; filesystems without it (ramfs, some network
and FUSE filesystems; tmpfs before Linux 6.6) make it fail with EINVAL."""

from __future__ import annotations

import errno
import mmap
import os
import tempfile


def direct_io_problem(directory: str, io_bytes: int = 4096) -> str | None:
    """None if an aligned O_DIRECT write and read of `io_bytes` (from a
    page-aligned buffer) work in `directory`, else why not. DeepSpeed pads
    swap I/O to 1024 B x intra_op_parallelism: a drive with larger logical
    blocks refuses the smaller sizes."""
    if not os.path.isdir(directory):
        return "not a directory"
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".iotune-odirect-")
        os.close(fd)
    except OSError as e:
        return f"cannot create a file there: {e.strerror}"
    buf = mmap.mmap(-1, io_bytes)      # page-aligned, as O_DIRECT needs
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_DIRECT)
        try:
            os.pwrite(fd, buf, 0)
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno == errno.EINVAL and io_bytes % 4096 == 0:
            return "the filesystem does not support O_DIRECT"
        if e.errno == errno.EINVAL:
            return f"O_DIRECT I/O of {io_bytes} B is refused (no O_DIRECT, or blocks larger than {io_bytes} B)"
        return f"O_DIRECT I/O failed: {e.strerror}"
    finally:
        buf.close()
        os.unlink(tmp)
    return None
