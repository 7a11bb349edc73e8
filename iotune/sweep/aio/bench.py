"""One trial of DeepSpeed's own aio engine, the way ZeRO-Infinity's swapper
drives it: write `files` tensor files with `aio_handle.async_pwrite`, wait,
read them all back with `async_pread`, wait, and check the data.

Run as a child process by AioExecutor (torch and DeepSpeed stay out of the
sweep process):

    python -m iotune.sweep.aio.bench --dir D --file-bytes N --files K \\
        --block-size B --queue-depth Q --intra-op-parallelism T \\
        --single-submit {0,1} --overlap-events {0,1} [--pin]

Stdout carries exactly one JSON object: the result, or {"error", "kind"}
with a non-zero exit (2 for bad arguments). DeepSpeed prints to stdout (its
accelerator warning, its logger, its C++ std::cout lines), so fd 1 is
pointed at stderr before torch is imported and the JSON goes to a private
copy of the original stdout.

DeepSpeed 0.19.8 behaviour this guards against (checked on this machine):
- Per-request results of io_getevents are never checked. A request that
  fails (EINVAL for a misaligned tail, ENOSPC, EIO) leaves a short file while
  wait() still counts the op as done, so file sizes are checked after the
  write phase and the data after the read phase.
- Its C++ asserts are compiled in and abort the process (SIGABRT): reading
  past the end of a file, wait() with nothing pending, a failed mlock. Hence
  the checks before any I/O, and wait() only after a successful submit.
- A failed open makes async_pwrite/async_pread return -1 and print the errno
  on stderr, so O_DIRECT support is probed first (fs.directio, which
  stays stdlib-only so this child need not import more), to say why.
- On the CPU build a tensor that is not page-locked is staged through an
  mlocked bounce buffer of its full size per request: with or without --pin,
  files x file_bytes bytes are locked at once.
"""

from __future__ import annotations

import argparse
import errno
import mmap
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ...fs.directio import direct_io_problem
from ...model.sweep import SweepPoint
from ..executor import Target
from ..child import json_child_main

DIRECT_IO_ALIGN_BYTES = 4096     # O_DIRECT: offsets and lengths aligned to the logical block (<= 4 KiB)
MAX_BLOCK_SIZE = 2**31 - 1       # aio_handle takes block_size as a C int
POISON_BYTE = 0xA5               # read buffers are filled with it, so bytes never read are caught
DIRECT_IO_UNSUPPORTED = "the filesystem does not support O_DIRECT"     # fs.directio's wording
CAP_IPC_LOCK = 14                # capability bit that lifts RLIMIT_MEMLOCK


class BenchError(Exception):
    """An expected failure: reported as {"error": message, "kind": kind}.

    kinds: usage, directory, o_direct, space, memlock, op_unavailable, io, verify."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class BenchConfig:
    """Everything one trial needs; its argv form is built and parsed here only."""

    directory: str
    file_bytes: int
    files: int
    block_size: int
    queue_depth: int
    intra_op_parallelism: int
    single_submit: bool
    overlap_events: bool
    pin: bool = False

    @classmethod
    def for_trial(cls, point: SweepPoint, target: Target, pin: bool) -> BenchConfig:
        return cls(directory=str(target.files_dir), file_bytes=target.file_bytes, files=target.files,
                   block_size=point.block_size, queue_depth=point.queue_depth,
                   intra_op_parallelism=point.intra_op_parallelism,
                   single_submit=point.single_submit, overlap_events=point.overlap_events, pin=pin)

    def to_argv(self) -> list[str]:
        argv = ["--dir", self.directory, "--file-bytes", str(self.file_bytes), "--files", str(self.files),
                "--block-size", str(self.block_size), "--queue-depth", str(self.queue_depth),
                "--intra-op-parallelism", str(self.intra_op_parallelism),
                "--single-submit", str(int(self.single_submit)), "--overlap-events", str(int(self.overlap_events))]
        return argv + (["--pin"] if self.pin else [])

    @property
    def total_bytes(self) -> int:
        return self.files * self.file_bytes

    def layout_problem(self) -> str | None:
        """Why DeepSpeed's aio cannot run these sizes with O_DIRECT, naming the fix; None if it can."""
        for name in ("file_bytes", "files", "block_size", "queue_depth", "intra_op_parallelism"):
            if getattr(self, name) < 1:
                return f"{name} must be at least 1, got {getattr(self, name)}"
        threads = self.intra_op_parallelism
        share = DIRECT_IO_ALIGN_BYTES * threads
        if self.file_bytes % share:
            fix = -(-self.file_bytes // share) * share
            why = ("O_DIRECT needs sizes aligned to 4096 bytes" if threads == 1 else
                   f"DeepSpeed splits each file into {threads} equal shares (intra_op_parallelism) "
                   "and O_DIRECT needs every share aligned to 4096 bytes")
            return f"file_bytes {self.file_bytes} is not a multiple of {share}: {why}; use file_bytes {fix}"
        if self.block_size % DIRECT_IO_ALIGN_BYTES or self.block_size > MAX_BLOCK_SIZE:
            fix = min(-(-self.block_size // DIRECT_IO_ALIGN_BYTES) * DIRECT_IO_ALIGN_BYTES, 1 << 30)
            return (f"block_size {self.block_size} is not a multiple of 4096 below 2 GiB: each request "
                    f"starts at a multiple of block_size and O_DIRECT needs 4096-byte-aligned offsets "
                    f"(and aio_handle takes a C int); use block_size {fix}")
        return None


def swap_paths(directory: str | Path, pid: int, files: int) -> list[Path]:
    """The trial's files; named by the bench's pid so its parent can remove them after a kill."""
    return [Path(directory) / f"iotune-aio-{pid}-{i}.swp" for i in range(files)]


# --- arguments --------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BenchError("usage", f"aio_bench: {message}")


def parse_args(argv: list[str] | None) -> BenchConfig:
    p = _Parser(prog="python -m iotune.sweep.aio.bench",
                description="Measure one DeepSpeed aio configuration; prints one JSON object.")
    p.add_argument("--dir", required=True, help="directory on the drive under test")
    p.add_argument("--file-bytes", type=int, required=True, help="bytes per file (multiple of 4096)")
    p.add_argument("--files", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--queue-depth", type=int, required=True)
    p.add_argument("--intra-op-parallelism", type=int, required=True)
    p.add_argument("--single-submit", type=int, choices=(0, 1), required=True)
    p.add_argument("--overlap-events", type=int, choices=(0, 1), required=True)
    p.add_argument("--pin", action="store_true", help="page-locked buffers from aio_handle.new_cpu_locked_tensor")
    a = p.parse_args(argv)
    return BenchConfig(directory=a.dir, file_bytes=a.file_bytes, files=a.files, block_size=a.block_size,
                       queue_depth=a.queue_depth, intra_op_parallelism=a.intra_op_parallelism,
                       single_submit=bool(a.single_submit), overlap_events=bool(a.overlap_events), pin=a.pin)


# --- checks before any DeepSpeed I/O ------------------------------------------

def check_place(config: BenchConfig) -> None:
    """The directory exists, is writable, takes O_DIRECT and has room."""
    d = Path(config.directory)
    if not d.exists():
        raise BenchError("directory", f"{d} does not exist: create it, or point the sweep at a directory "
                                      "on the drive under test")
    if not d.is_dir():
        raise BenchError("directory", f"{d} is not a directory")
    _probe_direct_io(d)
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    if free < config.total_bytes:
        raise BenchError("space", f"{d} has {free} bytes free but the trial writes {config.total_bytes} "
                                  "(files x file_bytes): free space or use fewer or smaller files")


def _probe_direct_io(directory: Path) -> None:
    """The one O_DIRECT probe (fs.directio, stdlib only), its answer as a BenchError."""
    problem = direct_io_problem(str(directory))
    if problem is None:
        return
    if problem == DIRECT_IO_UNSUPPORTED:
        raise BenchError("o_direct", f"{directory}: the filesystem does not support O_DIRECT, and DeepSpeed's "
                                     "aio opens every file with O_DIRECT; put the target on ext4, xfs or btrfs "
                                     "on a block device (not tmpfs before Linux 6.6, ramfs or most network or "
                                     "FUSE filesystems)")
    if os.strerror(errno.ENOSPC) in problem:
        raise BenchError("space", f"{directory}: no space left on the device")
    if problem.startswith("cannot create a file there"):
        raise BenchError("directory", f"cannot write to {directory}: {problem.partition(': ')[2]}")
    raise BenchError("o_direct", f"{directory}: {problem}")


def check_memlock(nbytes: int) -> None:
    """DeepSpeed's C++ aborts when mlock fails, so refuse up front."""
    if _has_capability(CAP_IPC_LOCK):
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= nbytes:
        return
    raise BenchError("memlock", f"the trial page-locks {nbytes} bytes (files x file_bytes: DeepSpeed's aio "
                                f"stages every request through mlocked memory) but the locked-memory limit is "
                                f"{soft} bytes; raise it (`ulimit -l unlimited`, or LimitMEMLOCK= for a systemd "
                                f"service) or use fewer or smaller files")


def _has_capability(bit: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return False


# --- the measurement ----------------------------------------------------------

def fill_pattern(buffer: Any, file_index: int) -> None:
    """Fill a uint8 tensor (length a multiple of 8) with 64-bit words unique to
    the file and the position, so a block landing at the wrong offset shows."""
    import torch
    base = (file_index + 1) << 40
    words = buffer.view(torch.int64)
    torch.arange(base, base + words.numel(), dtype=torch.int64, out=words)


def first_mismatch(buffer: Any, file_index: int) -> int | None:
    """Byte offset of the first 8-byte word differing from fill_pattern's, or None."""
    import torch
    base = (file_index + 1) << 40
    words = buffer.view(torch.int64)
    expected = torch.arange(base, base + words.numel(), dtype=torch.int64)
    if torch.equal(words, expected):
        return None
    return int(torch.nonzero(words != expected)[0, 0]) * 8


def _load_aio_op() -> tuple[Any, dict[str, Any]]:
    try:
        import deepspeed
        import torch
        from deepspeed.ops.op_builder import AsyncIOBuilder    # what the ZeRO swappers load
        start = time.perf_counter()
        op = AsyncIOBuilder().load(verbose=False)
    except Exception as e:   # ImportError, or RuntimeError from the JIT build (no libaio-dev, no ninja)
        raise BenchError("op_unavailable", f"DeepSpeed's async_io op cannot load ({type(e).__name__}: {e}); "
                                           "install libaio-dev and check with `iotune doctor`") from None
    return op, {"deepspeed_version": deepspeed.__version__, "torch_version": torch.__version__,
                "op_load_s": time.perf_counter() - start}


def _allocate(handle: Any, config: BenchConfig) -> tuple[list[Any], list[mmap.mmap]]:
    """One buffer per file: page-locked by DeepSpeed with --pin (as the swapper's
    buffer pool), else page-aligned anonymous memory (DeepSpeed bounces it)."""
    import torch
    if config.pin:
        example = torch.empty(0, dtype=torch.uint8)
        return [handle.new_cpu_locked_tensor(config.file_bytes, example) for _ in range(config.files)], []
    maps = [mmap.mmap(-1, config.file_bytes) for _ in range(config.files)]
    return [torch.frombuffer(m, dtype=torch.uint8) for m in maps], maps


def _run_phase(handle: Any, submit: Any, buffers: list[Any], paths: list[Path], op_name: str) -> float:
    """Submit one op per file, wait for all; wall seconds."""
    submitted = completed = 0
    start = time.perf_counter()
    try:
        for buf, path in zip(buffers, paths):
            rc = submit(buf, str(path), 0)
            if rc != 0:
                raise BenchError("io", f"{op_name}({path}) returned {rc}: DeepSpeed could not open or queue "
                                       "it (its errno is on stderr)")
            submitted += 1
    finally:
        if submitted:     # never leave ops pending: wait() and the handle's destructor assert on that
            completed = handle.wait()
    seconds = time.perf_counter() - start
    if completed != submitted:
        raise BenchError("io", f"{op_name}: wait() completed {completed} of {submitted} ops")
    return seconds


def _check_written(paths: list[Path], file_bytes: int) -> None:
    for path in paths:
        size = path.stat().st_size
        if size != file_bytes:
            raise BenchError("io", f"{path} has {size} of {file_bytes} bytes after async_pwrite: a request failed "
                                   "(ENOSPC, EIO, misalignment) and DeepSpeed's aio does not report per-request "
                                   "errors; check free space and dmesg")


def _verify(buffers: list[Any], paths: list[Path], block_size: int) -> None:
    for i, (buf, path) in enumerate(zip(buffers, paths)):
        offset = first_mismatch(buf, i)
        if offset is not None:
            raise BenchError("verify", f"data read back from {path} differs from what was written, first at byte "
                                       f"{offset} (request {offset // block_size} of block_size {block_size})")


def measure(config: BenchConfig) -> dict[str, Any]:
    op, versions = _load_aio_op()
    handle = op.aio_handle(block_size=int(config.block_size), queue_depth=int(config.queue_depth),
                           single_submit=bool(config.single_submit), overlap_events=bool(config.overlap_events),
                           intra_op_parallelism=int(config.intra_op_parallelism))
    buffers, _maps = _allocate(handle, config)
    paths = swap_paths(config.directory, os.getpid(), config.files)
    try:
        for i, buf in enumerate(buffers):
            fill_pattern(buf, i)
        write_s = _run_phase(handle, handle.async_pwrite, buffers, paths, "async_pwrite")
        _check_written(paths, config.file_bytes)
        for buf in buffers:
            buf.fill_(POISON_BYTE)
        read_s = _run_phase(handle, handle.async_pread, buffers, paths, "async_pread")
        _verify(buffers, paths, config.block_size)
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
        if config.pin:
            for buf in buffers:
                handle.free_cpu_locked_tensor(buf)
    total = config.total_bytes
    return {
        "write_bytes_per_s": total / write_s, "read_bytes_per_s": total / read_s,
        "write_s": write_s, "read_s": read_s, "bytes": total, "files": config.files,
        "file_bytes": config.file_bytes, "verified": True, "pinned": config.pin,
        "handle": {"block_size": handle.get_block_size(), "queue_depth": handle.get_queue_depth(),
                   "single_submit": handle.get_single_submit(), "overlap_events": handle.get_overlap_events(),
                   "intra_op_parallelism": handle.get_intra_op_parallelism()},
        **versions,
    }


# --- entry point ----------------------------------------------------------------

def run(argv: list[str] | None) -> tuple[int, dict[str, Any]]:
    """(exit status, the JSON object to print)."""
    try:
        config = parse_args(argv)
        problem = config.layout_problem()
        if problem:
            raise BenchError("usage", problem)
        check_place(config)
        check_memlock(config.total_bytes)
        return 0, measure(config)
    except BenchError as e:
        return (2 if e.kind == "usage" else 1), {"error": str(e), "kind": e.kind}
    except Exception as e:   # a bug or an unforeseen DeepSpeed failure: JSON for the journal, traceback on stderr
        traceback.print_exc()
        return 1, {"error": f"unexpected {type(e).__name__}: {e}", "kind": "unexpected"}


def main(argv: list[str] | None = None) -> int:
    return json_child_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
