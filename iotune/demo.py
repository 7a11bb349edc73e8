"""`iotune demo`: the main job on built-in defaults. Like cli.py, this module
composes the layers (volumes + trace); nothing imports it but cli.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from .errors import IotuneError
from .model.run import TraceRun
from .trace.session import TraceOptions, trace_command
from .volumes.scratch import scratch_drive

SWAP_FILES = ("fp32.tensor.swp", "exp_avg.tensor.swp", "exp_avg_sq.tensor.swp")
FILE_BYTES = 128 << 20
BLOCK_BYTES = 512 << 10


def swap_like_fio(directory: Path) -> list[str]:
    """fio writing, then reading back, three optimizer-state swap files with
    512 KiB O_DIRECT requests (libaio, queue depth 8): what ZeRO-Infinity's
    optimizer swapper does with DeepSpeed's aio defaults on a 512 KiB block."""
    common = [f"--directory={directory}", f"--filename={':'.join(SWAP_FILES)}",
              f"--size={len(SWAP_FILES) * FILE_BYTES}", f"--bs={BLOCK_BYTES}", "--direct=1",
              "--ioengine=libaio", "--iodepth=8", "--file_service_type=sequential"]
    return ["fio", "--output=/dev/null", "--group_reporting",
            "--name=swap-out", "--rw=write", *common,
            "--name=swap-in", "--stonewall", "--rw=read", *common]


def run_demo(workdir: Path | None, cap_bytes_per_s: int, say: Callable[[str], None]) -> TraceRun:
    if shutil.which("fio") is None:
        raise IotuneError("fio is not installed: run scripts/setup.sh or `iotune doctor --fix`")
    with scratch_drive(workdir, size_bytes=1 << 30, cap_bytes_per_s=cap_bytes_per_s, fstype="ext4") as drive:
        cap = f"capped at {cap_bytes_per_s / 1e6:g} MB/s" if cap_bytes_per_s else "uncapped"
        say(f"demo: scratch drive {drive.device.path} (1 GiB loop, direct I/O, ext4, {cap}) "
            f"at {drive.mount_point}")
        say(f"demo: fio writes then reads {len(SWAP_FILES)} × {FILE_BYTES >> 20} MiB swap files "
            f"in {BLOCK_BYTES >> 10} KiB O_DIRECT requests")
        argv = swap_like_fio(drive.mount_point or drive.image.parent)
        opts = TraceOptions(devices=(drive.device,), stdout_to_stderr=True,
                            cgroup=str(drive.cgroup) if drive.cgroup else None)
        return trace_command(argv, opts)
