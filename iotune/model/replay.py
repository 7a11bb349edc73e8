"""A job's swap schedule: the swap I/O of one steady optimizer step, in the
order the job issued it, read from the startup hook's events, so the step's
I/O can be replayed on a drive without the job (iotune.sweep.replay).

The hook records every tensor DeepSpeed's swap_in_tensors/swap_out_tensors
submits ({"k": "swap", "d", "p", "b", "s", "n", "t"}) and every aio_handle
wait() ({"k": "wait", "s", "n", "t0", "t1"}). DeepSpeed's partitioned
optimizer swapper drives one aio handle, and wait() completes every op
pending on it, so the ops submitted since the previous wait are the group
that wait completes. Between the groups the job computed (Adam, the copies
in and out of the swap buffers): the schedule keeps those times so a replay
overlaps compute and I/O as the job did, and without_compute() drops them to
measure the job's pattern at its best (the job-pattern ceiling).

Times in a group: gap_s from the previous wait's end (or the schedule's
start) to the first submit; each op's after_s from the group's first
submit; before_wait_s from the last submit to the wait (compute overlapped
with the I/O in flight). DeepSpeed writes and reads whole tensor files from
offset 0 (utils.swap_in_tensors/swap_out_tensors pass 0), so every op's
offset is 0 and its bytes are the pinned buffer's (aligned) size.

Which step: not the first (step 0 creates Adam's moments and writes twice
what it reads), one whose optimizer phase completed and that read something
(an fp16 overflow-skipped step only writes). By default the steady step
with the median optimizer time. A step that swaps parameters
(offload_param to NVMe) is refused: when parameters move depends on the
forward and backward (prefetch, reuse distance), not on a fixed schedule.

The schedule also keeps the swap directory the paths are relative to, as
traced (where a ceiling replays it: on the same drive), and the settings the
job's swap handle was made with (the hook's {"k": "aio"} event), so a
ceiling can be measured at the job's own settings too.

Pure: stdlib and iotune.model only.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import IotuneError
from .aio import AioSettings
from .attribution import PARAMETERS, categorize_swap_path
from .hook_events import event_lines
from .offload import MIN_AIO_BYTES

READ, WRITE = "read", "write"
AIO_ALIGNED_BYTES = 1024   # DeepSpeed's swap sizes are multiples of this x intra_op_parallelism (swap_tensor/utils.py)
SCHEDULE_VERSION = 1
UNSTEADY_STEP = 0        # the first step creates Adam's moments (writes 2x what it reads)
NOT_IN_STEP = ("checkpoint", "restore")     # phases whose swaps are not the step's


class ScheduleError(IotuneError):
    """The events do not hold a steady step that can be replayed; the message says why and what to run."""


@dataclass(frozen=True)
class SwapOp:
    """One tensor file submitted to the aio handle."""

    direction: str            # READ | WRITE
    path: str                 # relative to the swap directory (nvme_path), '/'-separated
    size_bytes: int
    offset_bytes: int = 0     # DeepSpeed writes whole files from offset 0
    after_s: float = 0.0      # compute from the group's first submit to this one's

    def to_json(self) -> dict[str, Any]:
        return {"d": self.direction, "p": self.path, "b": self.size_bytes, "o": self.offset_bytes,
                "after_s": self.after_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SwapOp:
        return cls(str(data["d"]), safe_relative(str(data["p"])), int(data["b"]), int(data.get("o", 0)),
                   float(data.get("after_s", 0.0)))


@dataclass(frozen=True)
class SwapGroup:
    """The ops one wait() completes, and the compute around them."""

    ops: tuple[SwapOp, ...]
    gap_s: float = 0.0                # compute before the first submit
    before_wait_s: float = 0.0        # compute between the last submit and the wait
    wait_s: float | None = None       # traced time blocked in wait() (None: no wait traced in the step)
    phase: str = "optimizer"          # the hook's phase of the wait (or of the last submit)

    def bytes_of(self, direction: str) -> int:
        return sum(op.size_bytes for op in self.ops if op.direction == direction)

    @property
    def submit_s(self) -> float:
        """Compute from the first submit to the last (each op's after_s counts from the first)."""
        return max((op.after_s for op in self.ops), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"ops": [op.to_json() for op in self.ops], "gap_s": self.gap_s, "before_wait_s": self.before_wait_s,
                "wait_s": self.wait_s, "phase": self.phase}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SwapGroup:
        wait = data.get("wait_s")
        return cls(tuple(SwapOp.from_json(o) for o in data.get("ops") or ()), float(data.get("gap_s", 0.0)),
                   float(data.get("before_wait_s", 0.0)), None if wait is None else float(wait),
                   str(data.get("phase", "optimizer")))


@dataclass(frozen=True)
class SwapSchedule:
    """The swap I/O of one steady step, grouped by the waits that complete it.

    traced_s is the time the replay is compared with: from the step's
    optimizer phase start (or its first submit, when the step swapped before
    it, e.g. gradients written during the backward) to the phase's end.
    optimizer_s is the optimizer phase alone, as the hook measured it."""

    groups: tuple[SwapGroup, ...]
    step: int
    optimizer_s: float
    traced_s: float
    tail_s: float = 0.0          # compute after the last wait to the end of the step's optimizer phase
    rank: int = 0
    source: str = ""             # where the events came from
    version: int = SCHEDULE_VERSION
    swap_dir: str = ""           # the absolute directory the paths are relative to, as traced ("": unknown)
    traced_aio: AioSettings | None = None     # the settings the job's swap handle was made with (None: not recorded)

    @property
    def read_bytes(self) -> int:
        return sum(g.bytes_of(READ) for g in self.groups)

    @property
    def write_bytes(self) -> int:
        return sum(g.bytes_of(WRITE) for g in self.groups)

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @property
    def ops(self) -> tuple[SwapOp, ...]:
        return tuple(op for g in self.groups for op in g.ops)

    @property
    def compute_s(self) -> float:
        """The job's compute the schedule sleeps: every gap, in and between the groups. An op's
        after_s counts from its group's first submit, so a group computes up to its last op's."""
        inside = sum(g.gap_s + g.before_wait_s + g.submit_s for g in self.groups)
        return inside + self.tail_s

    @property
    def traced_bytes_per_s(self) -> float:
        """Reads and writes of the step over its traced time: what the job achieved (the measure of a ceiling)."""
        return self.total_bytes / self.traced_s if self.traced_s > 0 else 0.0

    def files(self) -> dict[str, int]:
        """path -> the size a replay lays the file out at (the furthest byte any op touches)."""
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.path] = max(out.get(op.path, 0), op.offset_bytes + op.size_bytes)
        return out

    def without_compute(self) -> SwapSchedule:
        """The same I/O with every compute time at 0: the job's pattern at its best."""
        groups = tuple(replace(g, gap_s=0.0, before_wait_s=0.0, ops=tuple(replace(op, after_s=0.0) for op in g.ops))
                       for g in self.groups)
        return replace(self, groups=groups, tail_s=0.0)

    def under(self, prefix: str) -> SwapSchedule:
        """The same I/O with every file's path under `prefix` (e.g. "s1/"): in a directory of its own."""
        groups = tuple(replace(g, ops=tuple(replace(op, path=prefix + op.path) for op in g.ops)) for g in self.groups)
        return replace(self, groups=groups)

    def for_intra_op_parallelism(self, threads: int) -> SwapSchedule:
        """The schedule as DeepSpeed would swap it at `threads` (intra_op_parallelism): it pads every
        tensor to AIO_ALIGNED_BYTES x threads, so each op is rounded up to that (exactly DeepSpeed's
        size when the traced job's alignment divides it, as a job traced at 1 thread's always does)."""
        if threads < 1:
            raise ScheduleError(f"intra_op_parallelism must be at least 1, got {threads}")
        align = AIO_ALIGNED_BYTES * threads

        def up(op: SwapOp) -> SwapOp:
            return replace(op, size_bytes=-(-op.size_bytes // align) * align)
        return replace(self, groups=tuple(replace(g, ops=tuple(up(op) for op in g.ops)) for g in self.groups))

    def swapped_at(self, block_size: int) -> SwapSchedule:
        """The schedule as DeepSpeed would swap it at aio `block_size`: a tensor under
        max(MIN_AIO_BYTES, block_size) stays in RAM (OptimizerSwapper.is_swappable_tensor, for
        gradients, optimizer states and whole sub-groups alike), so its op is left out; a group left
        with none keeps its compute, carried into the next group's gap (or the tail), and its wait
        goes. From a schedule traced at DeepSpeed's default 1 MiB blocks this is every block size's
        (at 1 MiB and below, the schedule itself). Sizes are the ops' aligned bytes, a few KiB above
        the tensor's own at most, so a tensor that close under the threshold counts as swapped."""
        least = max(MIN_AIO_BYTES, block_size)
        groups: list[SwapGroup] = []
        carry = 0.0
        for g in self.groups:
            kept = [op for op in g.ops if op.size_bytes >= least]
            if not kept:
                carry += g.gap_s + g.submit_s + g.before_wait_s
                continue
            if len(kept) == len(g.ops) and not carry:
                groups.append(g)
                continue
            first = kept[0].after_s
            ops = tuple(replace(op, after_s=op.after_s - first) for op in kept)
            groups.append(replace(g, ops=ops, gap_s=carry + g.gap_s + first,
                                  before_wait_s=g.before_wait_s + g.submit_s - kept[-1].after_s))
            carry = 0.0
        return replace(self, groups=tuple(groups), tail_s=self.tail_s + carry)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "step": self.step, "rank": self.rank, "source": self.source,
                "optimizer_s": self.optimizer_s, "traced_s": self.traced_s, "tail_s": self.tail_s,
                "read_bytes": self.read_bytes, "write_bytes": self.write_bytes, "swap_dir": self.swap_dir,
                "traced_aio": self.traced_aio.to_ds_json() if self.traced_aio is not None else None,
                "groups": [g.to_json() for g in self.groups]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SwapSchedule:
        """Loads what to_json wrote (read_bytes/write_bytes are derived, not read back)."""
        aio = data.get("traced_aio")
        return cls(tuple(SwapGroup.from_json(g) for g in data.get("groups") or ()), int(data.get("step", 0)),
                   float(data.get("optimizer_s", 0.0)), float(data.get("traced_s", 0.0)),
                   float(data.get("tail_s", 0.0)), int(data.get("rank", 0)), str(data.get("source", "")),
                   int(data.get("version", SCHEDULE_VERSION)), str(data.get("swap_dir", "")),
                   AioSettings.from_ds_json(dict(aio)) if isinstance(aio, Mapping) else None)


def safe_relative(path: str) -> str:
    """`path` if it is a relative path that stays inside the directory it is taken from; else ScheduleError."""
    norm = posixpath.normpath(path.replace("\\", "/"))
    if not path or norm.startswith("/") or norm == ".." or norm.startswith("../") or norm == ".":
        raise ScheduleError(f"swap file path {path!r} is not relative to the swap directory: a schedule names "
                            "its files inside the directory it is replayed in; rebuild it with swap_schedule()")
    return norm


# --- building a schedule from the hook's events -----------------------------------


@dataclass(frozen=True)
class _Window:
    step: int
    t0_ns: int            # the optimizer phase's start
    t1_ns: int            # and end


@dataclass
class _Builder:
    """Groups a step's swap and wait events as they come (one process, in order)."""

    start_ns: int
    rel: Callable[[str], str]                  # absolute path -> relative path
    groups: list[SwapGroup] = field(default_factory=list)
    pending: list[tuple[int, str, str, int]] = field(default_factory=list)    # (t, direction, path, bytes)
    last_end_ns: int | None = None
    phase: str = ""

    def swap(self, ev: Mapping[str, Any]) -> None:
        size = int(ev.get("b", -1))
        if size < 0:
            raise ScheduleError(f"the hook could not size the swap of {ev.get('p')} (bytes {size}): the schedule "
                                "needs every op's bytes; trace the job again with this iotune's hook")
        direction = READ if ev.get("d") == "r" else WRITE
        self.pending.append((int(ev["t"]), direction, self.rel(str(ev["p"])), size))
        self.phase = str(ev.get("n", ""))

    def wait(self, ev: Mapping[str, Any]) -> None:
        if not self.pending:
            return       # a wait with nothing this step submitted (the previous step's ops): no group
        self._close(int(ev["t0"]), int(ev["t1"]), str(ev.get("n", "")))

    def _close(self, t0_ns: int | None, t1_ns: int, phase: str) -> None:
        first, last = self.pending[0][0], self.pending[-1][0]
        since = self.last_end_ns if self.last_end_ns is not None else self.start_ns
        ops = tuple(SwapOp(d, p, b, 0, (t - first) / 1e9) for t, d, p, b in self.pending)
        wait_s = None if t0_ns is None else (t1_ns - t0_ns) / 1e9
        before = max(0, (t0_ns if t0_ns is not None else t1_ns) - last) / 1e9
        self.groups.append(SwapGroup(ops, max(0, first - since) / 1e9, before, wait_s, phase or self.phase))
        self.pending = []
        self.last_end_ns = t1_ns

    def finish(self, end_ns: int) -> tuple[tuple[SwapGroup, ...], float]:
        """(groups, tail_s); ops still pending at the step's end form a last group with no traced wait."""
        if self.pending:
            self._close(None, max(end_ns, self.pending[-1][0]), self.phase)
        last = self.last_end_ns if self.last_end_ns is not None else self.start_ns
        return tuple(self.groups), max(0, end_ns - last) / 1e9


def optimizer_windows(events: Iterable[Mapping[str, Any]]) -> dict[int, _Window]:
    """step -> its optimizer phase (the step() call that completed it)."""
    out: dict[int, _Window] = {}
    for ev in events:
        if ev.get("k") == "phase" and ev.get("n") == "optimizer":
            step = int(ev["s"])
            out[step] = _Window(step, int(ev["t0"]), int(ev["t1"]))
    return out


def _step_events(events: list[Mapping[str, Any]], step: int, end_ns: int) -> list[Mapping[str, Any]]:
    """The step's swap and wait events up to the end of its optimizer phase, in the order the job issued them."""
    def when(ev: Mapping[str, Any]) -> int:
        return int(ev["t"] if ev.get("k") == "swap" else ev["t0"])
    return [ev for ev in events if ev.get("k") in ("swap", "wait") and int(ev.get("s", -1)) == step
            and str(ev.get("n", "")) not in NOT_IN_STEP and when(ev) <= end_ns]


def _swap_base(paths: Iterable[str], swap_dir: str | None) -> str:
    """The swap directory: `swap_dir`, else the directory holding DeepSpeed's zero_stage_<n>/
    folder, else the files' common directory."""
    paths = list(paths)
    if swap_dir is not None:
        return swap_dir
    marks = [p.replace("\\", "/").split("/zero_stage_")[0] for p in paths if "/zero_stage_" in p]
    return marks[0] if marks and len(set(marks)) == 1 else os.path.commonpath([os.path.dirname(p) for p in paths])


def _relative_to(base: str) -> Callable[[str], str]:
    """A function making each swap path relative to the swap directory `base`."""
    def rel(path: str) -> str:
        return safe_relative(os.path.relpath(path, base).replace(os.sep, "/"))
    return rel


def traced_aio(events: Iterable[Mapping[str, Any]]) -> AioSettings | None:
    """The settings of the first aio handle the process's swappers made (the hook's "aio" events), or None."""
    for ev in events:
        if ev.get("k") == "aio":
            try:
                return AioSettings(int(ev["block_size"]), int(ev["queue_depth"]), int(ev["intra_op_parallelism"]),
                                   bool(ev["single_submit"]), bool(ev["overlap_events"]))
            except (KeyError, TypeError, ValueError):
                return None
    return None


def steady_steps(events: list[Mapping[str, Any]]) -> list[int]:
    """Completed optimizer steps after the first that read something, in order."""
    windows = optimizer_windows(events)
    reads = {int(ev.get("s", -1)) for ev in events if ev.get("k") == "swap" and ev.get("d") == "r"
             and str(ev.get("n", "")) not in NOT_IN_STEP}
    return [s for s in sorted(windows) if s > UNSTEADY_STEP and s in reads]


def _median_step(events: list[Mapping[str, Any]], steps: list[int]) -> int:
    windows = optimizer_windows(events)
    ranked = sorted(steps, key=lambda s: (windows[s].t1_ns - windows[s].t0_ns, s))
    return ranked[len(ranked) // 2]


def swap_schedule(events: Iterable[Mapping[str, Any]], step: int | None = None, swap_dir: str | None = None,
                  rank: int = 0, source: str = "") -> SwapSchedule:
    """The schedule of `step` (default: the steady step with the median optimizer time) from one
    process's hook events in the order it wrote them; paths relative to `swap_dir` (default: found
    from DeepSpeed's zero_stage_<n>/ folder)."""
    events = list(events)
    steady = steady_steps(events)
    if step is None:
        if not steady:
            raise ScheduleError("no steady optimizer step in the events (one after the first, that read swap "
                                "files): run the job for at least 2 optimizer steps with NVMe offload, e.g. "
                                "--steps 3")
        step = _median_step(events, steady)
    elif step not in steady:
        raise ScheduleError(_why_not_steady(step, steady))
    window = optimizer_windows(events)[step]
    chosen = _step_events(events, step, window.t1_ns)
    _refuse_parameters(chosen, step)
    swaps = [ev for ev in chosen if ev.get("k") == "swap"]
    start = min([window.t0_ns] + [int(ev["t"]) for ev in swaps])
    base = _swap_base((str(ev["p"]) for ev in swaps), swap_dir)
    builder = _Builder(start, _relative_to(base))
    for ev in chosen:
        if ev.get("k") == "swap":
            builder.swap(ev)
        else:
            builder.wait(ev)
    groups, tail_s = builder.finish(window.t1_ns)
    return SwapSchedule(groups, step, (window.t1_ns - window.t0_ns) / 1e9, (window.t1_ns - start) / 1e9,
                        tail_s, rank, source, swap_dir=base if os.path.isabs(base) else "", traced_aio=traced_aio(events))


def _why_not_steady(step: int, steady: list[int]) -> str:
    have = f"steady steps in these events: {', '.join(map(str, steady))}" if steady else "no steady step here"
    if step == UNSTEADY_STEP:
        return (f"step 0 is not steady: it creates Adam's moments and writes twice what it reads; pick a later "
                f"step ({have})")
    return f"step {step} is not a completed step that read swap files ({have})"


def _refuse_parameters(events: list[Mapping[str, Any]], step: int) -> None:
    params = [ev for ev in events if ev.get("k") == "swap" and categorize_swap_path(str(ev["p"])) == PARAMETERS]
    if params:
        raise ScheduleError(f"step {step} swaps parameters to NVMe ({len(params)} ops, e.g. {params[0]['p']}): "
                            "when parameters move depends on the forward and backward (prefetch, reuse), which "
                            "a replay does not represent; measure real steps instead")


def read_swap_schedule(events_dir: Path, step: int | None = None, rank: int = 0,
                       swap_dir: str | None = None) -> SwapSchedule:
    """swap_schedule() of the process of `rank` that wrote events in `events_dir` (the first one with a step)."""
    per_file: dict[Path, list[Mapping[str, Any]]] = {}
    ranks: dict[Path, int] = {}
    for f, ev in event_lines(events_dir):
        if ev.get("k") == "proc":
            ranks[f] = int(ev.get("rank", 0))
        per_file.setdefault(f, []).append(ev)
    mine = [f for f in sorted(per_file) if ranks.get(f, 0) == rank and optimizer_windows(per_file[f])]
    if not mine:
        raise ScheduleError(f"no process of rank {rank} completed an optimizer step in {events_dir}: run the job "
                            "with iotune's hook (hook_env) for at least 2 optimizer steps")
    return swap_schedule(per_file[mine[0]], step, swap_dir, rank, str(events_dir))
