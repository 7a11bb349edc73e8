"""The verdict of a trace: is the step waiting on storage, how far is the
drive from what it can do, what limits the job, what to change and what that
buys. Each Finding carries its figures and, in `rule`, the rule in words
(docs/guide/report.md, "The verdict", explains them all).

Rules, with their thresholds (module constants):

- busy: a timeline interval in which the traced top-level devices issued
  bytes is busy, and so is a gap of at most BRIDGE_S between two busy
  intervals (device_use.BRIDGE_S: a throttled or queued drive releases
  requests in bursts).
- exposed I/O stall: per steady step, the busy time inside its phases
  (forward, backward, accumulate, optimizer step); its share of the step and,
  for the optimizer step alone, of the optimizer step. Compute that overlaps
  in-flight I/O counts as waiting: an upper bound.
- what limits the step: the largest of three parts of the median steady step:
  the stall (storage-bound), the optimizer step's time without I/O
  (cpu-optimizer-bound), forward + backward time without I/O (compute-bound).
  The run is start-up-dominated first when the steps cover less than
  STARTUP_SHARE of it.
- not on the traced device: DeepSpeed swapped bytes in the steady steps, and
  the traced devices carried less than OFF_DEVICE_SHARE of them.
- distance to the device (device_use), what to do (verdict_advice) and
  endurance (endurance) are explained in their modules.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ..model import units
from ..model.attribution import PhaseSpan
from ..model.run import TraceRun
from ..model.verdict import (COMPUTE_BOUND, CPU_OPTIMIZER_BOUND, NO_TRAINING, NOT_ON_DEVICE, STARTUP_DOMINATED,
                             STORAGE_BOUND, Finding, Verdict, VerdictInputs)
from .attribution import STEP_PHASES, StepBreakdown, steady, step_breakdowns
from .checkpoints import checkpoint_findings
from .device_use import BRIDGE_S, busy_spans, distance_findings, overlap
from .endurance import run_endurance
from .verdict_advice import storage_advice

STARTUP_SHARE = 0.2      # steps under this share of the run: start-up dominated
OFF_DEVICE_SHARE = 0.1   # block bytes under this share of swap bytes: the swap went elsewhere


@dataclass(frozen=True)
class StepStall:
    """One steady step: its time, and how much of it the devices were busy."""

    step: int
    total_s: float
    optimizer_s: float
    other_s: float              # forward + backward + accumulate
    stall_s: float              # busy time inside the step's phases
    optimizer_stall_s: float    # busy time inside the optimizer step


@dataclass(frozen=True)
class StepParts:
    """Medians over the steady steps (each its own median)."""

    steps: int
    total_s: float
    optimizer_s: float
    stall_s: float
    optimizer_stall_s: float
    optimizer_compute_s: float
    other_compute_s: float

    @property
    def stall_share(self) -> float:
        return self.stall_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def optimizer_stall_share(self) -> float:
        return self.optimizer_stall_s / self.optimizer_s if self.optimizer_s > 0 else 0.0

    def limit(self) -> str:
        parts = {STORAGE_BOUND: self.stall_s, CPU_OPTIMIZER_BOUND: self.optimizer_compute_s,
                 COMPUTE_BOUND: self.other_compute_s}
        return max(parts, key=lambda k: parts[k])


def _spans_of(run: TraceRun, rank: int = 0) -> dict[int, list[PhaseSpan]]:
    out: dict[int, list[PhaseSpan]] = defaultdict(list)
    for p in run.attribution.phases if run.attribution else ():
        if p.rank == rank and p.phase in STEP_PHASES:
            out[p.step].append(p)
    return out


def step_stalls(run: TraceRun, rows: list[StepBreakdown]) -> list[StepStall]:
    busy = busy_spans(run, bridge_s=BRIDGE_S)
    spans = _spans_of(run)
    origin = run.clock_origin_ns

    def busy_in(phases: Iterable[PhaseSpan]) -> float:
        return sum(overlap(busy, (p.t0_ns - origin) / 1e9, (p.t1_ns - origin) / 1e9) for p in phases)

    out = []
    for r in rows:
        mine = spans.get(r.step, [])
        opt = [p for p in mine if p.phase == "optimizer"]
        out.append(StepStall(r.step, r.total_s, r.phase_s.get("optimizer", 0.0),
                             sum(v for k, v in r.phase_s.items() if k != "optimizer"),
                             busy_in(mine), busy_in(opt)))
    return out


def step_parts(stalls: list[StepStall]) -> StepParts | None:
    if not stalls:
        return None

    def med(values: Iterable[float]) -> float:
        return float(statistics.median(values))

    return StepParts(
        steps=len(stalls), total_s=med(s.total_s for s in stalls), optimizer_s=med(s.optimizer_s for s in stalls),
        stall_s=med(s.stall_s for s in stalls), optimizer_stall_s=med(s.optimizer_stall_s for s in stalls),
        optimizer_compute_s=med(max(0.0, s.optimizer_s - s.optimizer_stall_s) for s in stalls),
        other_compute_s=med(max(0.0, s.other_s - (s.stall_s - s.optimizer_stall_s)) for s in stalls),
    )


def judge(run: TraceRun, inputs: VerdictInputs = VerdictInputs()) -> Verdict:
    """The verdict on `run`, with what the run does not hold in `inputs`."""
    rows = step_breakdowns(run)
    common = [*distance_findings(run, inputs, BRIDGE_S, rows)]
    wear = run_endurance(run, inputs)
    tail = [*([wear] if wear is not None else []), *checkpoint_findings(run, inputs)]
    if not rows:
        return _no_training(run, common + tail)
    stable = steady(rows)
    swapped = sum(r.swap_read_bytes + r.swap_write_bytes for r in stable)
    on_device = sum(r.block.read_bytes + r.block.write_bytes for r in stable)
    if swapped > 0 and on_device < OFF_DEVICE_SHARE * swapped:
        return _not_on_device(run, swapped, on_device, len(stable), common + tail)
    parts = step_parts(step_stalls(run, stable))
    if parts is None:      # unreachable: rows are never empty here
        return _no_training(run, common + tail)
    stall = stall_finding(parts)
    limit, limit_f = limit_finding(run, rows, parts)
    advice = (storage_advice(run, inputs, stable, parts.optimizer_s, parts.optimizer_compute_s)
              if parts.limit() == STORAGE_BOUND else [])
    findings = (stall, *common, limit_f, *advice, *tail)
    return Verdict(limit, summary_line(limit, parts, limit_f, advice), findings)


def _no_training(run: TraceRun, rest: list[Finding]) -> Verdict:
    if run.outcome in ("interrupted", "failed") and run.command:
        why = f"the command ended ({run.outcome}, exit {run.exit_status}) before any training step was recorded"
    elif run.attribution is not None:
        why = "the job ran with no DeepSpeedEngine training calls"
    else:
        why = "no training phases were recorded (not a Python/DeepSpeed job, or traced with --no-inject)"
    note = Finding("limit", f"No training verdict: {why}; what the devices did is below.",
                   "a step verdict needs the training phases the injected hooks record", {})
    return Verdict(NO_TRAINING, f"No training verdict: {why}.", (note, *rest))


def _not_on_device(run: TraceRun, swapped: float, on_device: float, steps: int, rest: list[Finding]) -> Verdict:
    traced = ", ".join(d.name for d in run.devices if not d.is_lower) or ", ".join(run.device_filter) or "none"
    head = (f"DeepSpeed swapped {units.mb(swapped)} MB in {steps} steady step(s), and the traced devices "
            f"({traced}) carried {units.mb(on_device)} MB of it: the swap files are on another device; "
            f"trace the one holding nvme_path (iotune trace --path NVME_PATH -- ...).")
    f = Finding("limit", head, f"swap bytes in the steady steps > 0 and block bytes on the traced devices "
                               f"< {OFF_DEVICE_SHARE:.0%} of them",
                {"swap_bytes": swapped, "block_bytes": on_device, "steps": steps})
    return Verdict(NOT_ON_DEVICE, "Not judged: the job's swap I/O did not touch the traced devices; trace the "
                                  "device holding nvme_path.", (f, *rest))


def stall_finding(p: StepParts) -> Finding:
    if p.stall_s <= 0:
        head = (f"No exposed I/O stall: the traced devices moved nothing inside the steps' phases "
                f"(median step {p.total_s:.3f} s over {p.steps} steady step(s)).")
    else:
        head = (f"Exposed I/O stall: {p.stall_s:.3f} s of the {p.total_s:.3f} s step ({p.stall_share:.0%}) and "
                f"{p.optimizer_stall_s:.3f} s of the {p.optimizer_s:.3f} s optimizer step "
                f"({p.optimizer_stall_share:.0%}) went by with swap I/O in flight on the traced devices "
                f"(median of {p.steps} steady step(s)).")
    rule = (f"time inside the step's phases (forward, backward, optimizer step) during which the traced devices "
            f"were moving bytes, from the block timeline; gaps up to {BRIDGE_S:g} s between I/O count as busy "
            f"(drives and throttles release requests in bursts); compute that overlaps in-flight I/O counts as "
            f"waiting, so this is an upper bound")
    return Finding("stall", head, rule, {
        "steps": p.steps, "step_s": p.total_s, "stall_s": p.stall_s, "stall_share": p.stall_share,
        "optimizer_s": p.optimizer_s, "optimizer_stall_s": p.optimizer_stall_s,
        "optimizer_stall_share": p.optimizer_stall_share})


def _run_share(run: TraceRun, rows: list[StepBreakdown]) -> float:
    steps_s = sum(r.total_s for r in rows)
    return steps_s / run.duration_s if run.duration_s > 0 else 1.0


def limit_finding(run: TraceRun, rows: list[StepBreakdown], p: StepParts) -> tuple[str, Finding]:
    step_limit = p.limit()
    total = p.total_s or 1.0       # shares of the median step (time between phases is in none of the three)
    words = {STORAGE_BOUND: "storage-bound", CPU_OPTIMIZER_BOUND: "CPU-optimizer-bound",
             COMPUTE_BOUND: "compute-bound"}
    split = (f"waiting on swap I/O {p.stall_s:.3f} s ({p.stall_s / total:.0%}), the optimizer step computing "
             f"{p.optimizer_compute_s:.3f} s ({p.optimizer_compute_s / total:.0%}), forward and backward "
             f"{p.other_compute_s:.3f} s ({p.other_compute_s / total:.0%})")
    share = _run_share(run, rows)
    figures: dict[str, float | int | str | None] = {
        "step_limit": step_limit, "stall_s": p.stall_s, "optimizer_compute_s": p.optimizer_compute_s,
        "forward_backward_compute_s": p.other_compute_s, "steps_share_of_run": share,
        "run_s": run.duration_s}
    rule = ("the largest of three parts of the median steady step: busy time inside its phases (storage-bound), "
            "the optimizer step's time without I/O (cpu-optimizer-bound), forward + backward time without I/O "
            f"(compute-bound); start-up-dominated when all steps together cover less than {STARTUP_SHARE:.0%} "
            "of the traced run")
    if share < STARTUP_SHARE:
        head = (f"Start-up dominated: the {len(rows)} step(s) took {share:.0%} of the {run.duration_s:.1f} s run "
                f"(the rest is launch, DeepSpeed initialisation, op loading and shutdown); within a step the job "
                f"is {words[step_limit]}: {split}. Trace more steps to judge a long run.")
        return STARTUP_DOMINATED, Finding("limit", head, rule, figures)
    head = f"{words[step_limit][0].upper()}{words[step_limit][1:]}: in the median steady step, {split}."
    return step_limit, Finding("limit", head, rule, figures)


def summary_line(limit: str, p: StepParts, limit_f: Finding, advice: list[Finding]) -> str:
    step_limit = str(limit_f.figures["step_limit"])
    first = {
        STORAGE_BOUND: f"Storage-bound: {p.stall_share:.0%} of the {p.total_s:.2f} s step waits on swap I/O",
        CPU_OPTIMIZER_BOUND: (f"CPU-optimizer-bound: the optimizer step computes for {p.optimizer_compute_s:.2f} s "
                              f"of the {p.total_s:.2f} s step; storage is not the limit"),
        COMPUTE_BOUND: (f"Compute-bound: forward and backward take {p.other_compute_s:.2f} s of the "
                        f"{p.total_s:.2f} s step; storage is not the limit"),
    }[step_limit]
    if limit == STARTUP_DOMINATED:
        first = f"Start-up dominated (steps are {limit_f.figures['steps_share_of_run']:.0%} of the run); " + \
            first[0].lower() + first[1:]
    todo = next((str(f.figures.get("action")) for f in advice if f.figures.get("action")), "")
    return first + (f"; {todo}" if todo else "") + "."
