"""`iotune demo`: the main job on built-in defaults. Like cli.py, this module
composes the layers (volumes + trace); nothing imports it but cli.py.

The job's own output (DeepSpeed's messages, the workload's IOTUNE_STEP
records, fio's) goes to its log, JOB_LOG in the run's directory, never to
the terminal; the steps reach `on_step` (a progress display) from that log
while the job runs."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from .blockdev.devices import BlockDevice
from .host.proc import not_installed
from .errors import IotuneError
from .model import units
from .model.run import TraceRun
from .model.runfile import make_dirs
from .model.steps import StepFollower, StepProgress
from .trace.session import TraceOptions, trace_command
from .volumes.beds import running_bed
from .volumes.scratch import scratch_drive

SWAP_FILES = ("fp32.tensor.swp", "exp_avg.tensor.swp", "exp_avg_sq.tensor.swp")
FILE_BYTES = 128 << 20
BLOCK_BYTES = 512 << 10
JOB_LOG = "job.log"


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


def training_argv(directory: Path, steps: int, precision: str) -> list[str]:
    """The built-in workload: ZeRO-3 with the optimizer state on the scratch
    drive, DeepSpeed's aio block at 512 KiB (as in Xinnor's published offload benchmark)."""
    swap = directory / "swap"
    swap.mkdir(exist_ok=True)
    return [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
            "--size", "tiny", "--steps", str(steps), "--nvme-path", str(swap),
            "--aio-block-size", str(BLOCK_BYTES), "--precision", precision]


@contextlib.contextmanager
def demo_drive(workdir: Path | None, cap_bytes_per_s: int, bed: str | None,
               say: Callable[[str], None]) -> Iterator[tuple[Path, tuple[BlockDevice, ...], str | None]]:
    """(directory, devices, cgroup): a capped scratch drive, or the test bed `bed`."""
    if bed is not None:
        with running_bed(bed, workdir) as b:
            say(f"demo: test bed {bed} ({b.spec.describe()}) on {', '.join(d.path for d in b.devices)} at {b.path}")
            yield b.path, b.devices, b.cgroup
        return
    with scratch_drive(workdir, size_bytes=1 << 30, cap_bytes_per_s=cap_bytes_per_s, fstype="ext4") as drive:
        cap = f"capped at {cap_bytes_per_s / 1e6:g} MB/s" if cap_bytes_per_s else "uncapped"
        say(f"demo: scratch drive {drive.device.path} (1 GiB loop, direct I/O, ext4, {cap}) "
            f"at {drive.mount_point}")
        yield drive.mount_point or drive.image.parent, (drive.device,), str(drive.cgroup) if drive.cgroup else None


def run_demo(workdir: Path | None, cap_bytes_per_s: int, say: Callable[[str], None],
             workload: str = "train", steps: int = 8, bed: str | None = None, log: Path | None = None,
             on_step: Callable[[StepProgress], None] | None = None) -> TraceRun:
    """The traced run of the demo's job. With `log`, the job's stdout and
    stderr go to that file (its directory is made), and with `on_step` too,
    a training job's steps are told to on_step as they finish."""
    if workload == "train" and importlib.util.find_spec("deepspeed") is None:
        raise IotuneError("the training demo needs DeepSpeed: run scripts/setup.sh (or use --workload fio)")
    if workload == "fio" and shutil.which("fio") is None:
        raise IotuneError(not_installed("fio"))
    with demo_drive(workdir, cap_bytes_per_s, bed, say) as (where, devices, cgroup):
        if workload == "train":
            from .workloads.precision import machine_precision

            precision, why = machine_precision()
            say(f"demo: {steps} steps of the built-in tiny Llama with ZeRO-3, optimizer state on the drive "
                f"(aio block {units.size(BLOCK_BYTES)}), in {precision} ({why}), traced with phase and swap "
                f"attribution")
            argv = training_argv(where, steps, precision)
        else:
            say(f"demo: fio writes then reads {len(SWAP_FILES)} × {units.size(FILE_BYTES)} swap files "
                f"in {units.size(BLOCK_BYTES)} O_DIRECT requests")
            argv = swap_like_fio(where)
        if log is not None:
            make_dirs(log.parent)
        opts = TraceOptions(devices=devices, stdout_to_stderr=True, inject=workload == "train",
                            interval_s=0.01 if workload == "train" else 1.0, cgroup=cgroup, log=log)
        if log is None or on_step is None or workload != "train":
            return trace_command(argv, opts)
        follow = StepFollower(log, steps, on_step)
        run = trace_command(argv, opts, lambda *_: follow.poll())
        follow.poll()           # the steps logged after the last look
        return run
