"""A candidate's swap schedule, derived from the traced schedule of the job's
own config (iotune.model.replay) and the byte model (iotune.model.offload),
so that candidates which change only how the optimizer's state is cut and
moved can be ranked on replays of their own I/O instead of real steps.

What DeepSpeed 0.19.8's partitioned optimizer swapper (one aio handle, no
pipelining; swap_tensor/partitioned_optimizer_swapper.py) does in a steady
step, and so what a derived schedule holds, in order:

- backward: each reduce bucket (stage3 reduce_independent_p_g_buckets:
  a bucket closes when the next gradient's full numel would pass
  reduce_bucket_size; the last one at the backward's end) hands its
  gradients to the gradient swapper (optimizer_utils._swap_out_gradients),
  grouped by sub-group in order of first appearance. The swapper
  (async_swapper.AsyncTensorSwapper) has every optimizer buffer
  (buffer_count of the largest sub-group, aligned) and packs each gradient,
  aligned, into the current buffer; when the next does not fit it submits
  the buffer, and when no buffer is free it also waits for all of them. A
  gradient smaller than max(1 MiB, block_size) stays in RAM.
- optimizer phase, per sub-group in order: the first swap-in flushes the
  gradient swapper (submit what is left, wait); a swappable sub-group's 3
  state files are read (one wait), its swapped gradients read (one wait),
  Adam runs, the 3 state files are written (one wait). A sub-group too small
  to swap runs Adam in RAM.

Sizes come from the byte model (sub_groups, aligned), so a derived
schedule moves exactly step_swap_bytes each way (checked). Its compute comes
from the base: what the base spends before its first swap-in and after its
last wait is kept; what it spends per sub-group (before the state reads,
before the gradient reads, before the writes: Adam) is measured per element
over the base's sub-groups and scaled by each candidate sub-group's
elements. The backward is the base's traced backward, and a bucket is
handed over at its share of it, counted in elements (the hook does not see
each reduction; a wait for gradient buffers there delays the rest of it, as
it holds the training thread). The gradients' order is the order the base
wrote them in.

Not derived (the caller runs real steps): the pipelined swapper (a read and
a write handle at once), parameters on NVMe, placement changes, a base
whose trace does not follow the order above. Pure: stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .attribution import GRADIENTS, categorize_swap_path
from .offload import ADAM_STATES, JobShape, OffloadKnobs, aligned, step_swap_bytes, sub_groups
from .hook_events import event_lines
from .replay import READ, WRITE, ScheduleError, SwapGroup, SwapOp, SwapSchedule, read_swap_schedule

STATE_FILES = ("{id}.tensor.swp", "exp_avg-{id}.tensor.swp", "exp_avg_sq-{id}.tensor.swp")   # fp32 master, moments
GRADIENT_FILE = re.compile(r"^(\d+)_(\d+)_gradient_(\d+)_(\d+)\.tensor\.swp$")
# the knobs a derived schedule represents: the rest must be the base's
REPLAYABLE_KNOBS = ("sub_group_size", "optimizer_buffer_count", "block_size", "intra_op_parallelism")


@dataclass(frozen=True)
class ReplayBase:
    """What the derivation takes from the reference trial: the traced schedule
    of its steady step, that step's backward phase, and the time from the
    backward's end to the optimizer phase's start."""

    schedule: SwapSchedule
    backward_s: float = 0.0
    handoff_s: float = 0.0

    @property
    def window_s(self) -> float:
        """The real step's time a derived schedule stands for: backward start to optimizer end."""
        return self.backward_s + self.handoff_s + self.schedule.optimizer_s

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule.to_json(), "backward_s": self.backward_s, "handoff_s": self.handoff_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayBase:
        return cls(SwapSchedule.from_json(data["schedule"]), float(data.get("backward_s", 0.0)),
                   float(data.get("handoff_s", 0.0)))


def read_replay_base(events_dir: Path, rank: int = 0) -> ReplayBase:
    """The schedule of the steady step read_swap_schedule picks in `events_dir`, with that
    step's backward phase (ScheduleError when the events do not hold one to replay)."""
    schedule = read_swap_schedule(events_dir, rank=rank)
    phases: dict[str, tuple[int, int]] = {}
    ranks: dict[Path, int] = {}
    for f, ev in event_lines(events_dir):
        if ev.get("k") == "proc":
            ranks[f] = int(ev.get("rank", 0))
        elif ev.get("k") == "phase" and int(ev.get("s", -1)) == schedule.step and ranks.get(f, 0) == rank:
            phases.setdefault(str(ev.get("n")), (int(ev["t0"]), int(ev["t1"])))
    if "backward" not in phases or "optimizer" not in phases:
        raise ScheduleError(f"step {schedule.step} has no backward or optimizer phase in {events_dir}: trace the "
                            "job with iotune's hook for at least 3 optimizer steps")
    (b0, b1), (o0, _) = phases["backward"], phases["optimizer"]
    return ReplayBase(schedule, (b1 - b0) / 1e9, max(0, o0 - b1) / 1e9)


@dataclass(frozen=True)
class ComputeRates:
    """The base step's compute: fixed before the first swap-in and after the
    last wait; per element of a sub-group before its state reads, before its
    gradient reads and before its writes (Adam)."""

    pre_s: float = 0.0
    read_s: float = 0.0
    gradient_s: float = 0.0
    adam_s: float = 0.0
    tail_s: float = 0.0

    @property
    def per_element_s(self) -> float:
        return self.read_s + self.gradient_s + self.adam_s


def replay_refusal(base: OffloadKnobs, knobs: OffloadKnobs) -> str:
    """Why `knobs` cannot be ranked on a schedule derived from `base`'s ("": it can)."""
    if not base.nvme_optimizer:
        return "your config keeps the optimizer's state off NVMe: there is no swap schedule to replay"
    if base.nvme_params:
        return "your config swaps parameters, whose timing depends on the forward and backward"
    if base.pipelined:
        return "your config pipelines the optimizer's swaps: its two aio handles are not told apart in the trace"
    if (knobs.optimizer_device, knobs.param_device) != (base.optimizer_device, base.param_device):
        return "it moves state to another device: compute and memory change, not only the swaps"
    if knobs.pipelined:
        return ("pipelining: DeepSpeed's pipelined swapper overlaps a read handle and a write handle, which the "
                "replay (one handle) does not represent")
    other = [f.name for f in fields(OffloadKnobs) if f.name not in REPLAYABLE_KNOBS
             and getattr(base, f.name) != getattr(knobs, f.name)]
    return f"it changes {', '.join(other)}, which the replay does not represent" if other else ""


# --- the job's tensors, cut as DeepSpeed cuts them --------------------------------------


def sub_group_members(knobs: OffloadKnobs, shape: JobShape) -> list[range]:
    """The tensor indices of each sub-group, as sub_groups() cuts them."""
    sizes, out, start = sub_groups(knobs, shape), [], 0
    parts = shape.partitions()
    for size in sizes:
        end, total = start, 0
        while total < size and end < len(parts):
            total, end = total + parts[end], end + 1
        out.append(range(start, end))
        start = end
    return out


def group_id(members: range) -> str:
    """DeepSpeed's name for a sub-group's files: its first and last parameter's ds_id."""
    return f"{members[0]}_{members[-1]}"


@dataclass(frozen=True)
class _Cut:
    """A config's sub-groups and swap threshold over the job's tensors."""

    members: tuple[range, ...]
    swappable: tuple[bool, ...]
    parts: tuple[int, ...]
    knobs: OffloadKnobs

    @classmethod
    def of(cls, knobs: OffloadKnobs, shape: JobShape) -> _Cut:
        members = tuple(sub_group_members(knobs, shape))
        parts = tuple(shape.partitions())
        swappable = tuple(4 * sum(parts[i] for i in m) >= knobs.min_swap_bytes for m in members)
        return cls(members, swappable, parts, knobs)

    def group_of(self, tensor: int) -> int:
        return next(g for g, m in enumerate(self.members) if tensor in m)

    def elements(self, group: int) -> int:
        return sum(self.parts[i] for i in self.members[group])

    def swaps_gradient(self, tensor: int) -> bool:
        return self.swappable[self.group_of(tensor)] and 4 * self.parts[tensor] >= self.knobs.min_swap_bytes

    def gradient_op(self, tensor: int, prefix: str, direction: str) -> SwapOp:
        g = self.group_of(tensor)
        offset = sum(self.parts[i] for i in self.members[g] if i < tensor)
        name = f"{group_id(self.members[g])}_gradient_{offset}_{self.parts[tensor]}.tensor.swp"
        return SwapOp(direction, prefix + name, 4 * aligned(self.parts[tensor], 4, self.knobs))

    def state_ops(self, group: int, prefix: str, direction: str) -> tuple[SwapOp, ...]:
        size = 4 * aligned(self.elements(group), 4, self.knobs)
        gid = group_id(self.members[group])
        return tuple(SwapOp(direction, prefix + name.format(id=gid), size) for name in STATE_FILES)


# --- reading the base ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Timed:
    """A base group with its times from the schedule's start."""

    group: SwapGroup
    first_s: float          # its first submit
    end_s: float            # its wait's end
    kind: str               # gradient-write | state-read | gradient-read | state-write | other


def _kind(group: SwapGroup) -> str:
    directions = {op.direction for op in group.ops}
    grads = {categorize_swap_path(op.path) == GRADIENTS for op in group.ops}
    if len(directions) != 1 or len(grads) != 1:
        return "other"
    return f"{'gradient' if grads == {True} else 'state'}-{'read' if directions == {READ} else 'write'}"


def _timeline(schedule: SwapSchedule) -> list[_Timed]:
    out, t = [], 0.0
    for g in schedule.groups:
        first = t + g.gap_s
        last = first + g.submit_s
        end = last + g.before_wait_s + (g.wait_s or 0.0)
        out.append(_Timed(g, first, end, _kind(g)))
        t = end
    return out


def _optimizer_groups(base: ReplayBase) -> tuple[float, list[_Timed]]:
    """(the optimizer phase's start from the schedule's start, its groups in order)."""
    s = base.schedule
    start = max(0.0, s.traced_s - s.optimizer_s)
    return start, [t for t in _timeline(s) if t.first_s >= start - 1e-9]


def _per_subgroup(groups: list[_Timed], source: str) -> list[list[_Timed]]:
    """The optimizer phase's groups after the gradient flush, one list per swapped sub-group
    (state reads, gradient reads if any, state writes); ScheduleError when they do not follow
    the partitioned swapper's order."""
    rest = groups[1:] if groups and groups[0].kind == "gradient-write" else groups
    out: list[list[_Timed]] = []
    for t in rest:
        opens = t.kind == "state-read"
        if opens:
            out.append([t])
        elif out and [x.kind for x in out[-1]] in (["state-read"], ["state-read", "gradient-read"]) \
                and t.kind in ("gradient-read", "state-write") and not (t.kind == "gradient-read"
                                                                        and len(out[-1]) == 2):
            out[-1].append(t)
        else:
            raise ScheduleError(f"the traced step ({source}) swaps in an order DeepSpeed's partitioned optimizer "
                                f"swapper does not (a {t.kind} group where it reads, then writes, a sub-group's "
                                "state): a candidate's schedule cannot be derived from it; rank on real steps")
    if out and out[-1][-1].kind != "state-write":
        raise ScheduleError(f"the traced step ({source}) ends before its last sub-group's state is written: "
                            "trace a step that completed; rank on real steps")
    return out


def _prefix(schedule: SwapSchedule) -> str:
    """The directory of the optimizer's swap files, relative to nvme_path ('zero_stage_3/optimizer/rank0/')."""
    state = next((op.path for op in schedule.ops if categorize_swap_path(op.path) != GRADIENTS), None)
    if state is None:
        raise ScheduleError("the traced step swaps no optimizer state: a candidate's schedule cannot be derived "
                            "from it; rank on real steps")
    return state.rsplit("/", 1)[0] + "/" if "/" in state else ""


def compute_rates(base: ReplayBase, knobs: OffloadKnobs, shape: JobShape) -> ComputeRates:
    """The base step's compute (ComputeRates), from its optimizer phase's groups cut into the
    sub-groups the byte model gives `knobs` (the base's own); ScheduleError when they differ."""
    start, groups = _optimizer_groups(base)
    subs = _per_subgroup(groups, base.schedule.source or "the reference")
    cut = _Cut.of(knobs, shape)
    swapped = [g for g, ok in enumerate(cut.swappable) if ok]
    sizes = [{op.size_bytes for op in sub[0].group.ops} for sub in subs]
    want = [{4 * aligned(cut.elements(g), 4, knobs)} for g in swapped]
    if sizes != want:
        raise ScheduleError(f"the traced step's sub-groups ({len(subs)} swapped, files of "
                            f"{sorted(b for s in sizes for b in s)} bytes) are not the offload model's for your config "
                            f"({len(swapped)}, {sorted(b for s in want for b in s)}): the job's tensors are not the "
                            "ones iotune saw; rank on real steps")
    flushed = bool(groups) and groups[0].kind == "gradient-write"
    n = [cut.elements(g) for g in swapped]
    read = [(sub[0].group.gap_s, e) for i, (sub, e) in enumerate(zip(subs, n)) if i or flushed]
    grad = [(sub[1].group.gap_s, e) for sub, e in zip(subs, n) if len(sub) == 3]
    adam = [(sub[-1].group.gap_s, e) for sub, e in zip(subs, n)]
    return ComputeRates(groups[0].first_s - start if groups else 0.0, _rate(read), _rate(grad), _rate(adam),
                        base.schedule.tail_s)


def _rate(samples: Sequence[tuple[float, int]]) -> float:
    elements = sum(e for _, e in samples)
    return sum(s for s, _ in samples) / elements if elements else 0.0


def gradient_order(base: ReplayBase, knobs: OffloadKnobs, shape: JobShape) -> list[int]:
    """The tensors whose gradients the base wrote, in the order it wrote them (its files named
    by the base's sub-groups, `knobs`): the order the backward hands them over."""
    cut = _Cut.of(knobs, shape)
    out: list[int] = []
    for op in base.schedule.ops:
        if op.direction != WRITE or categorize_swap_path(op.path) != GRADIENTS:
            continue
        m = GRADIENT_FILE.match(op.path.rsplit("/", 1)[-1])
        tensor = _tensor_at(cut, int(m[1]), int(m[3])) if m else None
        if m is None or tensor is None or cut.parts[tensor] != int(m[4]):
            raise ScheduleError(f"the traced gradient file {op.path} is not a gradient of the job's tensors as "
                                "iotune cuts them: a candidate's schedule cannot be derived; rank on real steps")
        if tensor not in out:
            out.append(tensor)
    return out


def _tensor_at(cut: _Cut, first: int, offset: int) -> int | None:
    """The tensor at element `offset` of the sub-group starting at tensor `first`."""
    at = 0
    for i in range(first, len(cut.parts)):
        if at == offset:
            return i
        at += cut.parts[i]
    return None


def handovers(order: Sequence[int], cut: _Cut, shape: JobShape) -> list[tuple[float, list[int]]]:
    """(share of the backward, tensors) for each reduce bucket, in order: the gradients the
    candidate swaps, grouped by its sub-groups in order of first appearance."""
    buckets: list[list[int]] = []
    filled = 0
    for t in order:
        if buckets and buckets[-1] and filled + shape.numels[t] > cut.knobs.reduce_bucket_size:
            buckets.append([])
            filled = 0
        if not buckets:
            buckets.append([])
        buckets[-1].append(t)
        filled += shape.numels[t]
    total, seen, out = sum(shape.numels[t] for t in order) or 1, 0, []
    for i, bucket in enumerate(buckets):
        seen += sum(shape.numels[t] for t in bucket)
        groups: dict[int, list[int]] = {}
        for t in bucket:
            if cut.swaps_gradient(t):
                groups.setdefault(cut.group_of(t), []).append(t)
        out.append((1.0 if i == len(buckets) - 1 else seen / total, [t for ts in groups.values() for t in ts]))
    return out


# --- building the candidate's schedule ---------------------------------------------------------


@dataclass
class _Program:
    """Compute, submits and waits in the order they happen, made into SwapGroups."""

    groups: list[SwapGroup] = field(default_factory=list)
    pending: list[SwapOp] = field(default_factory=list)
    gap_s: float = 0.0               # compute since the last wait (no op pending)
    since_first_s: float = 0.0       # compute since the pending group's first submit
    since_last_s: float = 0.0        # and since its last

    def compute(self, seconds: float) -> None:
        if self.pending:
            self.since_first_s += seconds
            self.since_last_s += seconds
        else:
            self.gap_s += seconds

    def submit(self, ops: Sequence[SwapOp]) -> None:
        for op in ops:
            if not self.pending:
                self.since_first_s = 0.0
            self.pending.append(replace(op, after_s=round(self.since_first_s, 9)))
            self.since_last_s = 0.0

    def wait(self) -> None:
        if self.pending:
            self.groups.append(SwapGroup(tuple(self.pending), round(self.gap_s, 9), round(self.since_last_s, 9)))
            self.pending, self.gap_s = [], 0.0


@dataclass
class _GradientSwapper:
    """DeepSpeed's AsyncTensorSwapper over `count` buffers of `capacity` elements."""

    program: _Program
    count: int
    capacity: int
    current: list[SwapOp] = field(default_factory=list)
    used: int = 0
    in_flight: int = 0
    active: bool = False             # holds the buffers (from the first gradient to the flush)

    def add(self, op: SwapOp) -> None:
        numel = op.size_bytes // 4
        if self.active and self.used + numel > self.capacity:
            self.program.submit(self.current)
            self.in_flight += 1
            if self.in_flight >= self.count:          # no buffer free: wait for all of them
                self.program.wait()
                self.in_flight = 0
            self.current, self.used = [], 0
        self.active = True
        self.current.append(op)
        self.used += numel

    def flush(self) -> None:
        """At the step's first swap-in: submit what is left and wait."""
        if self.active:
            self.program.submit(self.current)
            self.program.wait()
        self.current, self.used, self.in_flight, self.active = [], 0, 0, False


def derive_schedule(base: ReplayBase, base_knobs: OffloadKnobs, knobs: OffloadKnobs,
                    shape: JobShape) -> SwapSchedule:
    """`knobs`' swap schedule from the window's start (the backward's), derived from `base`
    (the trace of `base_knobs`); it moves step_swap_bytes(knobs, shape) each way, exactly.
    ScheduleError when it cannot be derived (replay_refusal, or a base the model does not fit)."""
    refusal = replay_refusal(base_knobs, knobs)
    if refusal:
        raise ScheduleError(f"not replayed: {refusal}")
    rates = compute_rates(base, base_knobs, shape)
    order = gradient_order(base, base_knobs, shape)
    cut, prefix = _Cut.of(knobs, shape), _prefix(base.schedule)
    missing = [t for t in range(len(cut.parts)) if cut.swaps_gradient(t) and t not in order]
    if missing:
        raise ScheduleError(f"not replayed: it swaps {len(missing)} gradient(s) your config keeps in RAM (e.g. "
                            f"tensor {missing[0]}), whose place in the backward the trace does not show")
    program = _Program()
    swapper = _GradientSwapper(program, knobs.optimizer_buffer_count,
                               aligned(max(cut.elements(g) for g in range(len(cut.members))), 4, knobs))
    done = 0.0
    for share, tensors in handovers(order, cut, shape):
        program.compute(share * base.backward_s - done)
        done = share * base.backward_s
        for t in tensors:
            swapper.add(cut.gradient_op(t, prefix, WRITE))
    program.compute(base.backward_s - done + base.handoff_s + rates.pre_s)
    _optimizer_step(program, swapper, cut, rates, prefix, order)
    s = base.schedule
    derived = SwapSchedule(tuple(program.groups), s.step, s.optimizer_s, base.window_s,
                           round(program.gap_s + rates.tail_s, 9), s.rank, f"derived from {s.source or 'a trace'}")
    check_bytes(derived, knobs, shape)
    return derived


def _optimizer_step(program: _Program, swapper: _GradientSwapper, cut: _Cut, rates: ComputeRates, prefix: str,
                    order: Sequence[int]) -> None:
    """The sub-groups in order: a swapped one's state reads, gradient reads and writes, each
    completed by a wait, with the compute per element before each; one kept in RAM computes."""
    for g in range(len(cut.members)):
        n = cut.elements(g)
        if not cut.swappable[g]:
            program.compute(rates.per_element_s * n)
            continue
        swapper.flush()
        program.compute(rates.read_s * n)
        program.submit(cut.state_ops(g, prefix, READ))
        program.wait()
        grads = [t for t in order if t in cut.members[g] and cut.swaps_gradient(t)]
        if grads:
            program.compute(rates.gradient_s * n)
            program.submit([cut.gradient_op(t, prefix, READ) for t in grads])
            program.wait()
        program.compute((rates.adam_s + (0.0 if grads else rates.gradient_s)) * n)
        program.submit(cut.state_ops(g, prefix, WRITE))
        program.wait()


def check_bytes(schedule: SwapSchedule, knobs: OffloadKnobs, shape: JobShape) -> None:
    """ScheduleError unless `schedule` reads and writes exactly what the byte model says `knobs` swap per step."""
    want = sum(step_swap_bytes(knobs, shape).values())
    if (schedule.read_bytes, schedule.write_bytes) != (want, want):
        raise ScheduleError(f"the derived schedule reads {schedule.read_bytes} and writes {schedule.write_bytes} "
                            f"bytes, the byte model {want} each way: a derivation bug; rank on real steps")


def align_starts(schedules: Sequence[SwapSchedule]) -> list[SwapSchedule]:
    """Derived schedules from a common start: the compute before the earliest first submit,
    the same in each, is left out of every one (a replay need not sleep it)."""
    lead = min((s.groups[0].gap_s if s.groups else s.tail_s for s in schedules), default=0.0)
    out = []
    for s in schedules:
        if s.groups:
            first = replace(s.groups[0], gap_s=round(s.groups[0].gap_s - lead, 9))
            out.append(replace(s, groups=(first, *s.groups[1:]), traced_s=s.traced_s - lead))
        else:
            out.append(replace(s, tail_s=round(s.tail_s - lead, 9), traced_s=s.traced_s - lead))
    return out
