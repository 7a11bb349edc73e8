"""A traced job's checkpoints: each save_checkpoint and load_checkpoint call
split into its parts (model states, optimizer partitions, the offloaded
tensors' copy, the recovery scripts, the decoupled writer's wait), on both
layers.

- application layer (TraceRun.app): the bytes the job's processes wrote or
  read on each of the checkpoint's files (bytes done, as the calls returned), whichever process did it (the
  decoupled writer's subprocess included): by path;
- block layer: the bytes issued on the traced top-level devices while each
  part ran (BlockTimeline windows over the part's spans); other I/O at the
  same time (swap traffic beside a decoupled write) counts too;
- the hook: each part's time, each file's size, and how much of it was
  still in the page cache when save_checkpoint returned (not yet durable).

Rates are decimal MB/s of the checkpoint's file bytes over the call's
seconds; `durable` counts only the bytes already on the drive when it returned.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..model import units
from ..model.checkpoint_io import PARTS, WRITER_WAIT, CheckpointCall, CheckpointIO
from ..model.run import TraceRun
from ..model.verdict import DeviceCeiling, Finding, VerdictInputs
from .attribution import BlockTimeline, Window


@dataclass(frozen=True)
class PartRow:
    """One part of one call."""

    part: str
    seconds: float                  # its spans, summed (the writer's subprocess included)
    file_bytes: int                 # its files' sizes (at return)
    not_durable_bytes: int | None   # save: of those, still in the page cache at return
    block_bytes: float              # block layer during its spans: written (save) or read (load)
    app_bytes: int | None           # application layer on its files: written (save) or read (load); None: not traced
    pids: tuple[int, ...]           # the processes that did it


@dataclass(frozen=True)
class CheckpointRow:
    """One save_checkpoint or load_checkpoint call of one rank."""

    rank: int
    op: str                          # save | load
    step: int
    t_s: float                       # start, seconds on the run's timeline
    seconds: float
    directory: str
    file_bytes: int
    not_durable_bytes: int | None    # save: bytes still in the page cache at return (None: unknown)
    meminfo_dirty_bytes: int | None  # save: the machine's Dirty + Writeback at return
    loaded: bool | None              # load: DeepSpeed found a checkpoint
    during: Window                   # block layer during the call
    until_end: Window                # block layer from its start to the end of the trace
    parts: tuple[PartRow, ...]

    @property
    def bytes_per_s(self) -> float | None:
        return self.file_bytes / self.seconds if self.seconds > 0 and self.file_bytes else None

    @property
    def durable_bytes_per_s(self) -> float | None:
        """File bytes on the drive at return over the call's time (save)."""
        if self.op != "save" or self.not_durable_bytes is None or self.seconds <= 0:
            return None
        return max(0, self.file_bytes - self.not_durable_bytes) / self.seconds


def checkpoint_rows(run: TraceRun, rank: int | None = 0) -> list[CheckpointRow]:
    """Every traced call of `rank` (None: every rank), in time order."""
    att = run.attribution
    if att is None or not att.checkpoints:
        return []
    block = BlockTimeline(run)
    end_ns = run.clock_origin_ns + int((max((p.t_s for p in run.timeline), default=0.0) + run.interval_s) * 1e9)
    return [_row(run, block, c, end_ns) for c in att.checkpoints if rank is None or c.rank == rank]


def _row(run: TraceRun, block: BlockTimeline, c: CheckpointCall, end_ns: int) -> CheckpointRow:
    op = "write" if c.op == "save" else "read"
    spans: dict[str, list[CheckpointIO]] = defaultdict(list)
    for io in c.io:
        spans[io.part].append(io)
    files: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    unknown = any(f.dirty_bytes is None for f in c.files)
    for f in c.files:
        files[f.part][0] += f.bytes
        files[f.part][1] += f.not_durable_bytes
    order = [p for p in (*PARTS, WRITER_WAIT, "other") if p in spans or p in files]
    parts = []
    for part in order:
        ios = spans.get(part, [])
        win = sum((block.window(i.t0_ns, i.t1_ns) for i in ios), Window())
        parts.append(PartRow(part, sum(i.seconds for i in ios), files[part][0] if part in files else 0,
                             None if unknown or c.op != "save" or part not in files else files[part][1],
                             win.write_bytes if op == "write" else win.read_bytes, _app_bytes(run, c, part, op),
                             tuple(sorted({i.pid for i in ios}))))
    return CheckpointRow(c.rank, c.op, c.step, (c.t0_ns - run.clock_origin_ns) / 1e9, c.seconds, c.directory,
                         c.file_bytes, c.not_durable_bytes() if c.op == "save" else None, c.meminfo_dirty_bytes,
                         c.loaded, block.window(c.t0_ns, c.t1_ns), block.window(c.t0_ns, max(end_ns, c.t1_ns)),
                         tuple(parts))


def _app_bytes(run: TraceRun, c: CheckpointCall, part: str, op: str) -> int | None:
    if run.app is None:
        return None
    paths = frozenset(f.path for f in c.files if f.part == part)
    # bytes done, not asked: shutil.copyfile asks sendfile for a whole file once more after the last byte
    return sum(f.result_bytes for f in run.app.files if f.op == op and f.path in paths)


def checkpoint_findings(run: TraceRun, inputs: VerdictInputs) -> list[Finding]:
    """One note per save (rank 0): its time, its rate against the drive's
    write ceiling where known, and what was not yet durable when it returned."""
    out = []
    top = [d.name for d in run.devices if not d.is_lower]
    for r in checkpoint_rows(run):
        if r.op != "save":
            continue
        ceiling = next((c for d in top for c in inputs.ceilings if c.device == d and _write_ceiling(c)), None)
        out.append(_save_finding(r, ceiling))
    return out


def _write_ceiling(ceiling: DeviceCeiling | None) -> float | None:
    """The drive's write rate a save is compared with: the ceiling's write figure, else its figure; none from a
    job-pattern ceiling (the swap pattern's reads and writes together, not a save's writes)."""
    if ceiling is None or (ceiling.job is not None and ceiling.write_bytes_per_s is None):
        return None
    return ceiling.write_bytes_per_s or ceiling.bytes_per_s


def _save_finding(r: CheckpointRow, ceiling: DeviceCeiling | None) -> Finding:
    rate, durable = r.bytes_per_s, r.durable_bytes_per_s
    limit = _write_ceiling(ceiling)
    head = f"save_checkpoint at {r.t_s:.2f} s took {r.seconds:.2f} s for {units.volume(r.file_bytes)}"
    if durable is not None:
        head += f": {units.mb_s(durable)} durable"
        if limit and ceiling is not None and durable > limit:
            head += f", faster than {ceiling.device}'s write ceiling ({units.mb_s(limit)}, measured with another pattern)"
        elif limit and ceiling is not None:
            head += f", {100 * durable / limit:.0f}% of {ceiling.device}'s write ceiling ({units.mb_s(limit)})"
    elif rate is not None:
        head += f" ({units.mb_s(rate)})"
    if r.not_durable_bytes:
        head += f"; {units.volume(r.not_durable_bytes)} were still in the page cache when it returned, not yet durable"
    rule = ("durable rate = (checkpoint file bytes - bytes still dirty or under writeback at return, by cachestat) "
            "/ save_checkpoint's time; ceiling: the drive's measured write rate")
    return Finding("note", head + ".", rule, {
        "seconds": r.seconds, "file_bytes": r.file_bytes, "not_durable_bytes": r.not_durable_bytes,
        "durable_bytes_per_s": durable, "write_ceiling_bytes_per_s": limit,
        "device": ceiling.device if ceiling is not None else None})
