"""Replays a job's swap schedule (iotune.model.replay.SwapSchedule) through
DeepSpeed's own aio_handle, in a child process started by
iotune.sweep.replay (torch and DeepSpeed stay out of the sweep process):

    python -m iotune.sweep.replayer --schedule FILE --dir D --block-size B \\
        --queue-depth Q --intra-op-parallelism T --single-submit {0,1} \\
        --overlap-events {0,1} [--repeats N] [--no-compute]
    python -m iotune.sweep.replayer --plan FILE --dir D [--no-compute]

--plan replays several schedules in one process, each at its own aio
setting: FILE holds {"entries": [{"schedule": ..., "aio": ...}, ...],
"order": [0, 1, 1, 0, ...]}, the schedule each replay runs, in order (the
offload search's ABBA pairs of a candidate and the job's own config). Each
schedule's files are laid out under s<i>/ in D, all before any timing, and
the results come in the order's order.

It lays the schedule's tensor files out in D at their sizes (written with
O_DIRECT through the same handle, then fsync'd, before any timing: a
fallocated file reads back without I/O), then, per repeat, issues the same
submits in the same order into page-locked buffers from
aio_handle.new_cpu_locked_tensor (DeepSpeed's swap buffers), waits where the
job waited, and sleeps the job's compute around them: each submit and wait
is held back until the traced gap after the previous wait's end has passed,
so compute overlaps the I/O as it did in the job. Each replay starts after
SETTLE_S of idle, as the job's step starts after its forward and backward.

Short I/O: DeepSpeed's aio never checks per-request results, so after every
wait the bytes the kernel counted this process submitting (/proc/self/io,
read_bytes and write_bytes, which include the aio threads) are compared with
the group's ops (a count short of them is short I/O; a page more is the
filesystem's own metadata now and then, which could hide a write short by
less than that page in the same group: a misaligned size fails in every
group and repeat, so it shows), and every read buffer is checked at each 1 KiB boundary
(where every request DeepSpeed issues starts) and its last word against the
pattern the files were laid out and rewritten with.

Stdout carries exactly one JSON object: {"results": [...], "layout_s", ...}
or {"error", "kind"} with a non-zero exit (2 for bad arguments); fd 1 is
pointed at stderr before torch loads, as in iotune.sweep.aio.bench.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from ..fs.directio import direct_io_problem
from ..model.aio import AioSettings
from ..model.replay import READ, WRITE, ScheduleError, SwapGroup, SwapOp, SwapSchedule
from ..model.replay_result import ReplayResult, WaitTiming
from .replay_io import BufferPool, IoCount, IoCounter, Pattern, ReplayFailure, layout_files, load_aio_op
from .child import json_child_main

T = TypeVar("T")
MARK_BYTES = 1024     # DeepSpeed's AIO_ALIGNED_BYTES: every request it issues starts on such a boundary
# Idle before each replay, not timed: the job's step starts after its forward and backward with the
# drive idle, and a blkio throttle still paying for the layout's writes held the first group back by
# 0.1 s at 40 MB/s (measured: the first of three replays 4.5 % slow without it, none with it)
SETTLE_S = 0.5


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ReplayFailure("usage", f"replayer: {message}")


@dataclass(frozen=True)
class ReplayArgs:
    schedule: SwapSchedule
    directory: Path
    aio: AioSettings
    repeats: int
    compute: bool
    others: tuple[tuple[SwapSchedule, AioSettings], ...] = ()   # --plan: the schedules after the first
    order: tuple[int, ...] = ()                                  # --plan: the schedule each replay runs

    @property
    def entries(self) -> tuple[tuple[SwapSchedule, AioSettings], ...]:
        return ((self.schedule, self.aio), *self.others)

    @property
    def sequence(self) -> tuple[int, ...]:
        return self.order or (0,) * self.repeats


def parse_args(argv: list[str] | None) -> ReplayArgs:
    p = _Parser(prog="python -m iotune.sweep.replayer", description="Replay a swap schedule; prints one JSON object.")
    p.add_argument("--schedule", help="the SwapSchedule's JSON file")
    p.add_argument("--plan", help="several schedules, each with its aio setting, and the order to replay them in")
    p.add_argument("--dir", required=True, help="an empty directory on the drive under test (links s<k> to empty "
                                                "directories put a plan's schedule k on another drive)")
    for name in ("--block-size", "--queue-depth", "--intra-op-parallelism"):
        p.add_argument(name, type=int)
    p.add_argument("--single-submit", type=int, choices=(0, 1))
    p.add_argument("--overlap-events", type=int, choices=(0, 1))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--no-compute", action="store_true", help="leave the job's compute out (the ceiling)")
    a = p.parse_args(argv)
    if (a.schedule is None) == (a.plan is None):
        raise ReplayFailure("usage", "replayer: give either --schedule (with the aio arguments) or --plan")
    if a.plan is not None:
        return _plan_args(a)
    if None in (a.block_size, a.queue_depth, a.intra_op_parallelism, a.single_submit, a.overlap_events):
        raise ReplayFailure("usage", "replayer: --schedule needs --block-size, --queue-depth, "
                                     "--intra-op-parallelism, --single-submit and --overlap-events")
    schedule = _read(a.schedule, SwapSchedule.from_json)
    aio = AioSettings(a.block_size, a.queue_depth, a.intra_op_parallelism, bool(a.single_submit),
                      bool(a.overlap_events))
    if a.repeats < 1:
        raise ReplayFailure("usage", "--repeats must be at least 1")
    return ReplayArgs(schedule if not a.no_compute else schedule.without_compute(), Path(a.dir), aio, a.repeats,
                      not a.no_compute)


def _read(path: str, load: Callable[[Any], T]) -> T:
    """`load` of the JSON in `path`; a usage failure naming the file when it is not one."""
    try:
        return load(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, ScheduleError) as e:
        raise ReplayFailure("usage", f"cannot read the schedule {path}: {e}") from None


def _plan_args(a: argparse.Namespace) -> ReplayArgs:
    def load(data: dict[str, Any]) -> tuple[list[tuple[SwapSchedule, AioSettings]], tuple[int, ...]]:
        entries = [(SwapSchedule.from_json(e["schedule"]), AioSettings.from_ds_json(dict(e["aio"])))
                   for e in data["entries"]]
        return entries, tuple(int(i) for i in data["order"])
    entries, order = _read(a.plan, load)
    if not entries or not order or any(not 0 <= i < len(entries) for i in order):
        raise ReplayFailure("usage", f"the plan {a.plan} needs schedules and an order of their indices")
    entries = [((s if not a.no_compute else s.without_compute()).under(prefix), aio)
               for prefix, (s, aio) in zip(_prefixes([s for s, _ in entries]), entries)]
    (first, aio), *others = entries
    return ReplayArgs(first, Path(a.dir), aio, len(order), not a.no_compute, tuple(others), order)


def _prefixes(schedules: list[SwapSchedule]) -> list[str]:
    """Each schedule's directory in a plan: schedules with the same files (paths and sizes: the job's
    schedule at aio settings that swap the same tensors at the same alignment) share one, so its
    files are laid out once; a replay's reads check the bytes the last write put there, which
    depend only on the path and offset."""
    seen: dict[frozenset[tuple[str, int]], str] = {}
    return [seen.setdefault(frozenset(s.files().items()), f"s{len(seen)}/") for s in schedules]


def check_args(args: ReplayArgs) -> None:
    """What would make DeepSpeed refuse or abort, said before any I/O."""
    for schedule, aio in args.entries:
        _check_entry(schedule, aio)
    if not args.directory.is_dir() or any(not _empty_link(p) for p in args.directory.iterdir()):
        raise ReplayFailure("directory", f"{args.directory} must be an empty directory on the drive under test "
                                         "(or hold only links to empty directories: a plan's schedules on other drives)")
    problem = direct_io_problem(str(args.directory))
    if problem:
        raise ReplayFailure("o_direct", f"{args.directory}: {problem}; DeepSpeed's aio opens every file with O_DIRECT")
    st = os.statvfs(args.directory)
    need = sum(sum(s.files().values()) for s, _ in args.entries)
    if st.f_bavail * st.f_frsize < need:
        raise ReplayFailure("space", f"{args.directory} has {st.f_bavail * st.f_frsize} bytes free; the schedule's "
                                     f"files take {need}: free space on the drive")


def _empty_link(path: Path) -> bool:
    """A link to an empty directory: where a caller puts one schedule of a plan (s<k>) on another drive."""
    return path.is_symlink() and path.is_dir() and not any(path.iterdir())


def _check_entry(schedule: SwapSchedule, aio: AioSettings) -> None:
    threads = aio.intra_op_parallelism
    for name in ("block_size", "queue_depth", "intra_op_parallelism"):
        if getattr(aio, name) < 1:
            raise ReplayFailure("usage", f"{name} must be at least 1")
    if aio.block_size % 4096:
        raise ReplayFailure("usage", f"block_size {aio.block_size} is not a multiple of 4096 (O_DIRECT)")
    odd = [op for op in schedule.ops if op.size_bytes % threads or op.size_bytes < 1]
    if odd:
        raise ReplayFailure("usage", f"{odd[0].path}: {odd[0].size_bytes} bytes do not split into {threads} equal "
                                     "shares (intra_op_parallelism), which DeepSpeed's aio refuses: replay it with "
                                     "an intra_op_parallelism that divides every op")
    if not schedule.groups:
        raise ReplayFailure("usage", "the schedule has no swap operations: nothing to replay")


# --- one replay -----------------------------------------------------------------------------


def _sleep_until(deadline: float) -> float:
    """Sleep until perf_counter() reaches `deadline`; the time then."""
    now = time.perf_counter()
    if deadline > now:
        time.sleep(deadline - now)
        now = time.perf_counter()
    return now


class Replay:
    """The handle, the buffers and the files of one schedule, replayed as often as asked."""

    def __init__(self, handle: Any, pool: BufferPool, schedule: SwapSchedule, root: Path, pattern: Pattern) -> None:
        self.handle, self.pool, self.schedule, self.root, self.pattern = handle, pool, schedule, root, pattern
        self.counter = IoCounter()

    def run(self, with_compute: bool, aio: AioSettings, layout_s: float) -> ReplayResult:
        waits: list[WaitTiming] = []
        short: list[str] = []
        start = anchor = time.perf_counter()
        for i, group in enumerate(self.schedule.groups):
            timing, problems, anchor = self._group(i, group, anchor)
            waits.append(timing)
            short += problems
        seconds = _sleep_until(anchor + self.schedule.tail_s) - start
        s = self.schedule
        return ReplayResult(seconds, sum(w.read_bytes for w in waits), sum(w.write_bytes for w in waits),
                            s.read_bytes, s.write_bytes, tuple(waits), aio, with_compute, tuple(short), layout_s)

    def _group(self, index: int, group: SwapGroup, anchor: float) -> tuple[WaitTiming, list[str], float]:
        """Replay one group `gap_s` after `anchor` (the previous wait's end): its timing, its
        problems, and its wait's end."""
        before = self.counter.read()
        first = _sleep_until(anchor + group.gap_s)
        last = first
        bufs = self.pool.views(group.ops)
        for op, buf in zip(group.ops, bufs):
            last = _sleep_until(first + op.after_s)
            self._submit(op, buf)
        w0 = _sleep_until(last + group.before_wait_s)
        done = self.handle.wait()
        w1 = time.perf_counter()
        moved = self.counter.read() - before
        problems = [] if done == len(group.ops) else [f"group {index}: wait() completed {done} of {len(group.ops)} ops"]
        problems += self._check(index, group, moved, bufs)
        timing = WaitTiming(index, w1 - w0, w1 - first, min(moved.read_bytes, group.bytes_of(READ)),
                            min(moved.write_bytes, group.bytes_of(WRITE)), group.wait_s, moved.read_bytes,
                            moved.write_bytes)
        return timing, problems, w1

    def _submit(self, op: SwapOp, buf: Any) -> None:
        path = str(self.root / op.path)
        if op.direction == READ:
            self.pattern.poison(buf)
            rc = self.handle.async_pread(buf, path, op.offset_bytes)
        else:
            self.pattern.mark(buf, op.path, op.offset_bytes)
            rc = self.handle.async_pwrite(buf, path, op.offset_bytes)
        if rc != 0:
            raise ReplayFailure("io", f"async_{'pread' if op.direction == READ else 'pwrite'}({path}) returned {rc}: "
                                      "DeepSpeed could not open or queue it (its errno is on stderr)")

    def _check(self, index: int, group: SwapGroup, moved: IoCount, bufs: list[Any]) -> list[str]:
        out = []
        for direction, counted in ((READ, moved.read_bytes), (WRITE, moved.write_bytes)):
            expected = group.bytes_of(direction)
            if counted < expected:
                out.append(f"group {index}: {direction}s of {expected} bytes, the kernel counted {counted} "
                           "submitted: a request failed (misaligned size, ENOSPC, EIO) and DeepSpeed's aio does "
                           "not report it; check the alignment of the sizes, free space and dmesg")
        for op, buf in zip(group.ops, bufs):
            if op.direction == READ:
                bad = self.pattern.first_bad(buf, op.path, op.offset_bytes)
                if bad is not None:
                    out.append(f"group {index}: the read of {op.path} did not bring back the file's bytes at offset "
                               f"{bad + op.offset_bytes}: a request failed and DeepSpeed's aio does not report it")
        return out


def replay(args: ReplayArgs) -> dict[str, Any]:
    op, versions = load_aio_op()
    handles: dict[AioSettings, Any] = {}
    for _, a in args.entries:
        if a not in handles:
            handles[a] = op.aio_handle(block_size=a.block_size, queue_depth=a.queue_depth,
                                       single_submit=a.single_submit, overlap_events=a.overlap_events,
                                       intra_op_parallelism=a.intra_op_parallelism)
    first = handles[args.aio]
    every = SwapSchedule(tuple(g for s, _ in args.entries for g in s.groups), 0, 0.0, 0.0)
    pool = BufferPool(first, every)       # DeepSpeed's locked buffers serve every handle (one shared manager)
    pattern = Pattern(sorted(every.files()), MARK_BYTES)
    try:
        layout_s = layout_files(first, pool, every.files(), args.directory, pattern)
        runners = [Replay(handles[a], pool, s, args.directory, pattern) for s, a in args.entries]
        results = []
        for i in args.sequence:
            time.sleep(SETTLE_S)
            results.append(runners[i].run(args.compute, args.entries[i][1], layout_s))
    finally:
        pool.free()
    return {"results": [r.to_json() for r in results], "order": list(args.sequence), "layout_s": layout_s,
            **versions}


def run(argv: list[str] | None) -> tuple[int, dict[str, Any]]:
    """(exit status, the JSON object to print)."""
    try:
        args = parse_args(argv)
        check_args(args)
        return 0, replay(args)
    except ReplayFailure as e:
        return (2 if e.kind == "usage" else 1), {"error": str(e), "kind": e.kind}
    except Exception as e:   # a bug or an unforeseen DeepSpeed failure: JSON for the caller, traceback on stderr
        traceback.print_exc()
        return 1, {"error": f"unexpected {type(e).__name__}: {e}", "kind": "unexpected"}


def main(argv: list[str] | None = None) -> int:
    return json_child_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
