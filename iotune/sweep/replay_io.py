"""The replayer's parts that touch torch, DeepSpeed and the kernel's counters
(iotune.sweep.replayer runs them in its child process): loading the aio op,
the page-locked buffer pool, the files' layout, the data pattern that shows
a failed request, and the per-process I/O counters."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model.offload import pages
from ..model.replay import SwapGroup, SwapOp, SwapSchedule

POISON = -0x5A5A5A5A5A5A5A5B      # negative: never a pattern word
CAP_IPC_LOCK = 14


class ReplayFailure(Exception):
    """An expected failure: reported as {"error": message, "kind": kind}.

    kinds: usage, directory, o_direct, space, memlock, op_unavailable, io."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def load_aio_op() -> tuple[Any, dict[str, Any]]:
    """DeepSpeed's async_io op as the ZeRO swappers load it, and the versions."""
    try:
        import deepspeed
        import torch
        from deepspeed.ops.op_builder import AsyncIOBuilder
        start = time.perf_counter()
        op = AsyncIOBuilder().load(verbose=False)
    except Exception as e:   # ImportError, or RuntimeError from the JIT build (no libaio-dev, no ninja)
        raise ReplayFailure("op_unavailable", f"DeepSpeed's async_io op cannot load ({type(e).__name__}: {e}); "
                                              "install libaio-dev and check with `iotune doctor`") from None
    return op, {"deepspeed_version": deepspeed.__version__, "torch_version": torch.__version__,
                "op_load_s": time.perf_counter() - start}


@dataclass(frozen=True)
class IoCount:
    read_bytes: int
    write_bytes: int

    def __sub__(self, other: IoCount) -> IoCount:
        return IoCount(self.read_bytes - other.read_bytes, self.write_bytes - other.write_bytes)


class IoCounter:
    """Bytes this process (all its threads: DeepSpeed's aio threads submit) sent to storage."""

    def __init__(self, path: str = "/proc/self/io") -> None:
        self.path = path

    def read(self) -> IoCount:
        values = {}
        with open(self.path) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                values[key] = int(value)
        return IoCount(values["read_bytes"], values["write_bytes"])


def _check_memlock(nbytes: int) -> None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:") and int(line.split()[1], 16) >> CAP_IPC_LOCK & 1:
                return
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != resource.RLIM_INFINITY and soft < nbytes:
        raise ReplayFailure("memlock", f"the replay page-locks {nbytes} bytes (its largest group's ops, each in "
                                       f"a buffer of its own, as DeepSpeed's swap buffers) but the locked-memory "
                                       f"limit is {soft}; "
                                       "raise it (`ulimit -l unlimited`)")


def group_bytes(group: SwapGroup) -> int:
    """The locked bytes a group's ops take at once: each op its own page-aligned buffer."""
    return sum(pages(op.size_bytes) for op in group.ops)


class BufferPool:
    """Page-locked memory from the handle (aio_handle.new_cpu_locked_tensor, DeepSpeed's swap
    buffers): one buffer as large as the most bytes one group of the schedule has in flight, each op
    of a group given a page-aligned slice of its own. So the replay locks what the job had in flight
    at once (at 1B, 3.9 GB for a schedule of 35 groups), not as many buffers as the largest group has
    ops, each as large as the largest op (112 x 1.05 GB there: more than the machine's memory)."""

    def __init__(self, handle: Any, schedule: SwapSchedule) -> None:
        import torch
        self.nbytes = max(group_bytes(g) for g in schedule.groups)
        self.largest_op = pages(max(op.size_bytes for op in schedule.ops))
        _check_memlock(self.nbytes)
        self.handle = handle
        self.buffer = handle.new_cpu_locked_tensor(self.nbytes, torch.empty(0, dtype=torch.uint8))

    def views(self, ops: Sequence[SwapOp]) -> list[Any]:
        """A slice of the buffer for each op, `op.size_bytes` long, none overlapping."""
        out, start = [], 0
        for op in ops:
            out.append(self.buffer.narrow(0, start, op.size_bytes))
            start += pages(op.size_bytes)
        return out

    def chunks(self) -> list[Any]:
        """Slices of the largest op's size (page-aligned), as many as the buffer holds: the layout's."""
        return [self.buffer.narrow(0, i * self.largest_op, self.largest_op)
                for i in range(self.nbytes // self.largest_op)]

    def free(self) -> None:
        self.handle.free_cpu_locked_tensor(self.buffer)


class Pattern:
    """Every file's 8-byte words numbered from a base of its own; a buffer
    carries them at every `mark_bytes` boundary and in its last word, so a
    read that did not land shows as the poison or another file's word."""

    def __init__(self, paths: list[str], mark_bytes: int) -> None:
        self.base = {p: (i + 1) << 40 for i, p in enumerate(paths)}
        self.stride = mark_bytes // 8

    def _views(self, buf: Any, path: str, offset: int) -> tuple[Any, Any, Any, Any]:
        """(marks, their expected words, the last word's view, its expected word)."""
        import torch
        n = buf.numel() - buf.numel() % 8
        words = buf.narrow(0, 0, n).view(torch.int64)
        first = self.base[path] + offset // 8
        marks = words[::self.stride]
        expected = torch.arange(first, first + words.numel(), self.stride, dtype=torch.int64)
        return marks, expected, words[-1:], first + words.numel() - 1

    def mark(self, buf: Any, path: str, offset: int) -> None:
        if buf.numel() < 8:
            return
        marks, expected, last, last_word = self._views(buf, path, offset)
        marks.copy_(expected)
        last.fill_(last_word)

    def poison(self, buf: Any) -> None:
        import torch
        n = buf.numel() - buf.numel() % 8
        if n == 0:
            return
        words = buf.narrow(0, 0, n).view(torch.int64)
        words[::self.stride].fill_(POISON)
        words[-1:].fill_(POISON)

    def first_bad(self, buf: Any, path: str, offset: int) -> int | None:
        """Byte offset in `buf` of the first mark that is not the file's word, or None."""
        import torch
        if buf.numel() < 8:
            return None
        marks, expected, last, last_word = self._views(buf, path, offset)
        if not torch.equal(marks, expected):
            return int(torch.nonzero(marks != expected)[0, 0]) * self.stride * 8
        if int(last[0]) != last_word:
            return int(buf.numel() - buf.numel() % 8) - 8
        return None


def layout_files(handle: Any, pool: BufferPool, files: dict[str, int], root: Path, pattern: Pattern) -> float:
    """Write every file at its size with the pattern, through the handle (O_DIRECT), and fsync it:
    seconds taken. A file only fallocated would read back without I/O. The pool's buffer is cut into
    chunks of the largest op's size, each carrying one, and as many as it holds are in flight at once
    (one wait for each such batch), so a drive that needs requests in flight is written at its rate,
    not one chunk's."""
    start = time.perf_counter()
    counter = IoCounter()
    before = counter.read()
    chunk_bufs = pool.chunks()
    step = pool.largest_op
    chunks = [(rel, offset) for rel, size in files.items() for offset in range(0, size, step)]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
    for first in range(0, len(chunks), len(chunk_bufs)):
        for buf, (rel, offset) in zip(chunk_bufs, chunks[first:first + len(chunk_bufs)]):
            chunk = buf.narrow(0, 0, min(step, files[rel] - offset))
            pattern.mark(chunk, rel, offset)
            if handle.async_pwrite(chunk, str(root / rel), offset) != 0:
                raise ReplayFailure("io", f"laying out {root / rel}: async_pwrite returned non-zero (its errno is "
                                          f"on stderr)")
        handle.wait()
    for rel in files:
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    written = (counter.read() - before).write_bytes
    short = [rel for rel, size in files.items() if (root / rel).stat().st_size != size]
    if short or written < sum(files.values()):
        raise ReplayFailure("io", f"laying out the schedule's files wrote {written} of {sum(files.values())} bytes "
                                  f"({', '.join(short) or 'sizes right'}): a request failed (misaligned size, ENOSPC, "
                                  "EIO) and DeepSpeed's aio does not report it; check the sizes, free space and dmesg")
    return time.perf_counter() - start
