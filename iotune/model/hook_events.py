"""The files iotune's startup hook writes inside a Python job, read back.

The hook (iotune/trace/inject/, located through iotune.resources.inject_dir)
writes IOTUNE_EVENTS_DIR/events-<pid>.jsonl in every process of the job:
one {"k": "proc"} line, then {"k": "phase"} and {"k": "swap"} events (see
_iotune_hooks.py for the format). Both `iotune trace` (attribution) and
`iotune sweep --steps-cmd` (step and optimizer-step times of the user's own
job) read them through this module, so the parsing lives in one place.
Pure: stdlib only, no iotune imports beyond model.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .attribution import Attribution, PhaseSpan, SwapTotal, categorize_swap_path
from .checkpoint_io import LATEST, RECOVERY, WRITER_WAIT, CheckpointCall, CheckpointFile, CheckpointIO, checkpoint_part

EVENTS_ENV = "IOTUNE_EVENTS_DIR"      # where the hook writes; the hook is inert without it
MAX_STEPS_ENV = "IOTUNE_MAX_STEPS"    # the hook ends each process after this many optimizer steps
STEP_PHASES = ("optimizer", "accumulate")   # DeepSpeedEngine.step() calls, by the hook's naming


SHAPE_ONLY_ENV = "IOTUNE_SHAPE_ONLY"


def hook_env(env: dict[str, str], hook_dir: Path, events_dir: Path,
             max_steps: int | None = None, shape_only: bool = False) -> dict[str, str]:
    """`env` with the startup hook (`hook_dir`) first on PYTHONPATH and the
    events directory set; with `max_steps`, each process of the job exits
    (SystemExit(0)) right after its max_steps-th optimizer step; with
    `shape_only`, at deepspeed.initialize, once the model's tensors are
    reported and before DeepSpeed allocates anything."""
    out = dict(env)
    out.pop(SHAPE_ONLY_ENV, None)
    if shape_only:
        out[SHAPE_ONLY_ENV] = "1"
    path = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = f"{hook_dir}{os.pathsep}{path}" if path else str(hook_dir)
    out[EVENTS_ENV] = str(events_dir)
    if max_steps is not None:
        out[MAX_STEPS_ENV] = str(max_steps)
    else:
        out.pop(MAX_STEPS_ENV, None)
    return out


def _event_lines(events_dir: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(file, event) for every complete event of every process."""
    files = sorted(events_dir.glob("events-*.jsonl")) if events_dir.is_dir() else []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue     # a process killed mid-write leaves a partial last line
            if isinstance(ev, dict):
                yield f, ev


def event_lines(events_dir: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(file, event) for every complete event of every process, each file in the order its process wrote it."""
    return _event_lines(events_dir)


def read_events(events_dir: Path) -> Attribution | None:
    """Everything the hooks wrote, or None if no process reported anything."""
    phases: list[PhaseSpan] = []
    swaps: dict[tuple[int, int, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    paths: dict[str, set[str]] = defaultdict(set)
    ranks: set[int] = set()
    rank_of: dict[Path, int] = {}
    pid_of: dict[Path, int] = {}
    calls: list[CheckpointCall] = []
    ios: list[CheckpointIO] = []
    seen_any = False
    for f, ev in _event_lines(events_dir):
        kind = ev.get("k")
        rank = rank_of.get(f, 0)
        if kind == "proc":
            rank_of[f], pid_of[f] = int(ev.get("rank", 0)), int(ev.get("pid", 0))
        elif kind == "ckcall":
            seen_any = True
            calls.append(_call(ev, rank, pid_of.get(f, 0)))
        elif kind == "ckio":
            ios.append(_io(ev, pid_of.get(f, 0)))
        elif kind == "phase":
            seen_any = True
            ranks.add(rank)
            phases.append(PhaseSpan(rank, int(ev["s"]), str(ev["n"]), int(ev["t0"]), int(ev["t1"])))
        elif kind == "swap":
            seen_any = True
            cat = categorize_swap_path(str(ev["p"]))
            key = (rank, int(ev["s"]), str(ev["n"]), cat, "read" if ev["d"] == "r" else "write")
            swaps[key][0] += max(0, int(ev["b"]))
            swaps[key][1] += 1
            paths[cat].add(str(ev["p"]))
    if not seen_any:
        return None
    return Attribution(
        phases=tuple(sorted(phases, key=lambda p: (p.rank, p.t0_ns))),
        swaps=tuple(SwapTotal(r, s, n, c, d, b, t) for (r, s, n, c, d), (b, t) in sorted(swaps.items())),
        ranks=tuple(sorted(ranks)),
        swap_files={c: len(p) for c, p in sorted(paths.items())},
        checkpoints=checkpoint_calls(calls, ios),
    )


def _call(ev: dict[str, Any], rank: int, pid: int) -> CheckpointCall:
    files = []
    for row in ev.get("files") or ():
        path, size, dirty, writeback = (list(row) + [None, None, None, None])[:4]
        files.append(CheckpointFile(str(path), checkpoint_part(str(path)) or "other", int(size or 0),
                                    None if dirty is None else int(dirty),
                                    None if writeback is None else int(writeback)))
    loaded = ev.get("loaded")
    return CheckpointCall(rank, str(ev.get("op", "")), int(ev.get("s", 0)), int(ev["t0"]), int(ev["t1"]),
                          str(ev.get("dir", "")), (), tuple(files),
                          None if ev.get("mem") is None else int(ev["mem"]),
                          None if loaded is None else bool(loaded), pid, str(ev.get("raised", "")))


def _io(ev: dict[str, Any], pid: int) -> CheckpointIO:
    path = str(ev.get("p", ""))
    part = WRITER_WAIT if ev.get("w") == "commit" else checkpoint_part(path) or "other"
    return CheckpointIO(part, path, int(ev.get("t0", 0)), int(ev.get("t1", 0)), pid)


def checkpoint_calls(calls: list[CheckpointCall], ios: list[CheckpointIO]) -> tuple[CheckpointCall, ...]:
    """Each call with the parts that belong to it: by path (a file under its
    <dir>/<tag>, or the recovery scripts beside it), whichever process did
    it (the decoupled writer's subprocess has its own pid), to the latest
    call of that directory that began before the part did."""
    calls = sorted(calls, key=lambda c: c.t0_ns)
    owned: dict[int, list[CheckpointIO]] = defaultdict(list)
    for io in sorted(ios, key=lambda i: i.t0_ns):
        match = [i for i, c in enumerate(calls) if c.t0_ns <= io.t0_ns and _belongs(io.path, c.directory)]
        if match:
            owned[match[-1]].append(io)
    return tuple(replace(c, io=tuple(owned.get(i, ()))) for i, c in enumerate(calls))


def _belongs(path: str, directory: str) -> bool:
    base = directory.rstrip("/")
    if not base:
        return False
    if path.startswith(base + "/") or path.rstrip("/") == base:
        return True
    return os.path.dirname(path) == os.path.dirname(base) and checkpoint_part(path) in (RECOVERY, LATEST)


def read_losses(events_dir: Path) -> dict[int, list[tuple[int, float]]]:
    """rank -> (step, loss) of every backward call in order, as the hook
    recorded them with IOTUNE_LOSSES=1 (step: this process's 0-based count)."""
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    rank = 0
    for _, ev in _event_lines(events_dir):
        if ev.get("k") == "proc":
            rank = int(ev.get("rank", 0))
        elif ev.get("k") == "loss":
            out[rank].append((int(ev.get("s", 0)), float(ev["v"])))
    return dict(out)


@dataclass(frozen=True)
class HookProcess:
    """One process the hook ran in (its "proc" line)."""

    pid: int
    rank: int
    argv: tuple[str, ...]
    omp_threads: str | None      # OMP_NUM_THREADS as the process saw it (None: unset)


def read_processes(events_dir: Path) -> list[HookProcess]:
    """The processes that wrote events, in file order."""
    out = []
    for _, ev in _event_lines(events_dir):
        if ev.get("k") == "proc":
            omp = ev.get("omp")
            out.append(HookProcess(int(ev.get("pid", 0)), int(ev.get("rank", 0)),
                                   tuple(str(a) for a in ev.get("argv") or ()),
                                   None if omp is None else str(omp)))
    return out


@dataclass(frozen=True)
class MemorySample:
    """A rank's memory after one of its optimizer steps (bytes)."""

    rank: int
    step: int
    locked_bytes: int            # VmLck: mlock'd, where DeepSpeed's swap buffers live
    rss_bytes: int
    peak_rss_bytes: int = 0      # VmHWM: the largest RSS so far (0: an older hook)


def read_memory(events_dir: Path) -> list[MemorySample]:
    """Every rank's memory samples, in file order (one per completed step,
    and one at the exit of each process that reported anything)."""
    out = []
    rank = 0
    for _, ev in _event_lines(events_dir):
        if ev.get("k") == "proc":
            rank = int(ev.get("rank", 0))
        elif ev.get("k") == "mem":
            out.append(MemorySample(rank, int(ev.get("s", 0)), int(ev.get("lck", 0)), int(ev.get("rss", 0)),
                                    int(ev.get("hwm", 0))))
    return out


def read_io_waits(events_dir: Path) -> dict[int, float]:
    """step -> seconds the slowest rank's training thread spent blocked in
    wait() on its swap I/O during that step (the exposed I/O stall)."""
    per: dict[tuple[int, int], int] = defaultdict(int)
    rank = 0
    for _, ev in _event_lines(events_dir):
        if ev.get("k") == "proc":
            rank = int(ev.get("rank", 0))
        elif ev.get("k") == "wait":
            per[(rank, int(ev.get("s", 0)))] += int(ev.get("t1", 0)) - int(ev.get("t0", 0))
    out: dict[int, float] = {}
    for (_, step), ns in per.items():
        out[step] = max(out.get(step, 0.0), ns / 1e9)
    return out


@dataclass(frozen=True)
class StartupMemory:
    """One process as it called deepspeed.initialize (bytes): its VmRSS, its
    VmHWM (the peak so far) and the host memory its parameters' storages
    held then (each distinct storage once; under deepspeed.zero.Init the
    partitions, ds_tensor, since the parameters' own data is then empty)."""

    rss_bytes: int
    peak_rss_bytes: int
    param_storage_bytes: int

    @property
    def baseline_bytes(self) -> int:
        """What the process holds besides its parameters, which the
        host-memory model counts as items of their own (so never twice)."""
        return max(0, self.rss_bytes - self.param_storage_bytes)


@dataclass(frozen=True)
class JobTensors:
    """What the hook saw of the job's model: every parameter tensor's element
    count in model order, the data-parallel size and the micro-batch; and
    the process's memory at deepspeed.initialize (the largest rank's
    baseline; None: an older hook, or unreadable)."""

    numels: tuple[int, ...]
    world: int
    micro_batch: int
    partition_dtype: str = ""       # fp32 | bf16 | fp16 ZeRO-3 partitions them in ("": not reported)
    startup: StartupMemory | None = None


def read_tensors(events_dir: Path) -> JobTensors | None:
    """The first rank's report of the job's parameter tensors (None: none
    seen): the engine's, at its first step, else deepspeed.initialize's
    (whose micro-batch is unknown: 0)."""
    found: list[JobTensors] = []
    starts: list[StartupMemory] = []
    for _, ev in _event_lines(events_dir):
        if ev.get("k") == "shape" and isinstance(ev.get("numels"), list):
            found.append(JobTensors(tuple(int(n) for n in ev["numels"]), int(ev.get("world", 1)),
                                    int(ev.get("micro", 1)), str(ev.get("dtype") or "")))
            if isinstance(ev.get("rss"), int):
                starts.append(StartupMemory(int(ev["rss"]), int(ev.get("hwm", ev["rss"])), int(ev.get("params", 0))))
    dtype = next((t.partition_dtype for t in found if t.partition_dtype), "")
    best = next((t for t in found if t.micro_batch), found[0] if found else None)
    startup = max(starts, key=lambda m: (m.baseline_bytes, m.peak_rss_bytes), default=None)
    return replace(best, partition_dtype=dtype, startup=startup) if best is not None else None


@dataclass(frozen=True)
class StepTiming:
    """One completed training step, the slowest rank's times.

    step_s runs from the end of the previous step's optimizer phase (for the
    first step seen: from its first recorded phase) to the end of this one's,
    so it holds everything the loop does, data loading included.
    optimizer_step_s is the time inside DeepSpeedEngine.step() in this step
    (every micro-step's call, as the built-in workload measures it)."""

    step: int
    step_s: float
    optimizer_step_s: float


def step_timings(att: Attribution | None) -> list[StepTiming]:
    """Completed steps (those with an "optimizer" phase), in order; per step
    the maximum over ranks, since the slowest rank sets the pace."""
    if att is None:
        return []
    per_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for rank in att.ranks:
        for step, times in _rank_steps([p for p in att.phases if p.rank == rank]).items():
            per_step[step].append(times)
    return [StepTiming(s, max(t[0] for t in ts), max(t[1] for t in ts)) for s, ts in sorted(per_step.items())]


def _rank_steps(phases: list[PhaseSpan]) -> dict[int, tuple[float, float]]:
    """step -> (step_s, optimizer_step_s) for one rank's completed steps."""
    ends: dict[int, int] = {}
    starts: dict[int, int] = {}
    opt_ns: dict[int, int] = defaultdict(int)
    for p in phases:
        starts[p.step] = min(starts.get(p.step, p.t0_ns), p.t0_ns)
        if p.phase in STEP_PHASES:
            opt_ns[p.step] += p.t1_ns - p.t0_ns
        if p.phase == "optimizer":
            ends[p.step] = max(ends.get(p.step, p.t1_ns), p.t1_ns)
    out: dict[int, tuple[float, float]] = {}
    previous_end: int | None = None
    for step in sorted(ends):
        begin = previous_end if previous_end is not None else starts[step]
        out[step] = ((ends[step] - begin) / 1e9, opt_ns[step] / 1e9)
        previous_end = ends[step]
    return out


def completed_steps(events_dir: Path) -> int:
    """Optimizer steps every rank that reported has completed so far."""
    per_rank: dict[Path, int] = defaultdict(int)
    for f, ev in _event_lines(events_dir):
        if ev.get("k") == "phase":
            per_rank[f] += ev.get("n") == "optimizer"
    return min(per_rank.values()) if per_rank else 0
