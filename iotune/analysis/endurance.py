"""SSD endurance: how fast a job wears its drive.

    written per hour    = bytes written per second of training x 3,600
    written per day     = bytes written per second x 86,400   (training around the clock)
    drive writes / day  = written per day / drive capacity    (DWPD; per TB of capacity when unknown)
    days to rated TBW   = (rated TBW - already written) / written per day

For a traced training job the rate is block-level bytes written on the
traced top-level devices over the steady steps (start-up and the tail left
out), divided among the devices by each one's share of the run's writes;
the busiest device is the one that wears out first. For any other run it is
the run's writes over its duration. For a planned job (`iotune plan`) it is
the planner's bytes written per optimizer step over the step time, and with
`--checkpoint-every K` a checkpoint's bytes over every K steps (each step
then also takes a K-th of the checkpoint's save time).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import units
from ..model.plan import CheckpointPlan, Plan
from ..model.run import TraceRun
from ..model.verdict import Finding, VerdictInputs
from .attribution import steady, step_breakdowns

SECONDS_PER_DAY = 86_400
TB = 10**12


@dataclass(frozen=True)
class WriteRate:
    """Bytes written per second on one drive, and what that figure is based on."""

    bytes_per_s: float
    basis: str                     # in words, e.g. "4 steady steps: 48.0 MB written in 1.60 s"
    device: str = ""               # the busiest drive ("" for a plan)
    capacity_bytes: float = 0.0    # that drive's, 0: unknown
    capacity_source: str = ""


@dataclass(frozen=True)
class Endurance:
    rate: WriteRate
    tbw_bytes: float | None = None
    tbw_source: str = ""
    written_bytes: float | None = None   # already written (SMART), subtracted from the TBW

    @property
    def bytes_per_hour(self) -> float:
        return self.rate.bytes_per_s * 3600

    @property
    def bytes_per_day(self) -> float:
        return self.rate.bytes_per_s * SECONDS_PER_DAY

    @property
    def drive_writes_per_day(self) -> float | None:
        cap = self.rate.capacity_bytes
        return self.bytes_per_day / cap if cap > 0 else None

    @property
    def writes_per_day_per_tb(self) -> float:
        """Drive writes per day of a 1 TB (10^12 B) drive."""
        return self.bytes_per_day / TB

    @property
    def days_to_tbw(self) -> float | None:
        if not self.tbw_bytes or self.bytes_per_day <= 0:
            return None
        return max(0.0, self.tbw_bytes - (self.written_bytes or 0.0)) / self.bytes_per_day


def run_write_rate(run: TraceRun, capacity_bytes: float | None = None) -> WriteRate | None:
    """The busiest traced drive's write rate (None when nothing was written)."""
    top = [d for d in run.devices if not d.is_lower]
    written = {d.name: d.direction("write").bytes for d in top}
    total = sum(written.values())
    if total <= 0:
        return None
    busiest = max(top, key=lambda d: (written[d.name], d.name))
    share = written[busiest.name] / total
    rows = steady(step_breakdowns(run))
    step_s, step_bytes = sum(r.total_s for r in rows), sum(r.block.write_bytes for r in rows)
    if rows and step_s > 0 and step_bytes > 0:
        rate = step_bytes * share / step_s
        basis = f"{len(rows)} steady step(s): {units.mb(step_bytes)} MB written in {step_s:.2f} s"
    elif run.duration_s > 0:
        rate = total * share / run.duration_s
        basis = f"the whole run: {units.mb(total)} MB written in {run.duration_s:.2f} s"
    else:
        return None
    if len(top) > 1:
        basis += f", {100 * share:.0f}% of it on {busiest.name}"
    if capacity_bytes:
        cap, source = float(capacity_bytes), "--drive-capacity"
    else:
        cap, source = float(busiest.size_bytes), f"size of {busiest.name} recorded by the trace"
    return WriteRate(rate, basis, busiest.name, cap, source if cap > 0 else "")


def plan_write_rate(plan: Plan, step_s: float, step_source: str, capacity_bytes: float | None = None,
                    checkpoint: CheckpointPlan | None = None) -> WriteRate | None:
    """One drive's write rate for a planned job: the rank's bytes written per
    optimizer step (and per step of the checkpoint interval), striped over
    its drives, every `step_s` seconds."""
    saved = (checkpoint.written_bytes_per_step or 0.0) if checkpoint is not None else 0.0
    per_step = (plan.per_optimizer_step.total_write + saved) / plan.inp.drives
    if per_step <= 0 or step_s <= 0:
        return None
    with_ckpt = (f", checkpoints included ({units.volume(saved / plan.inp.drives)} of it: one every "
                 f"{checkpoint.every_steps} steps)" if saved and checkpoint is not None else "")
    basis = (f"{units.volume(per_step)} written per optimizer step per drive{with_ckpt} "
             f"({plan.inp.drives} drive(s) per rank) every {step_s:,.2f} s ({step_source})")
    return WriteRate(per_step / step_s, basis, "", float(capacity_bytes or 0),
                     "--drive-capacity" if capacity_bytes else "")


def _days(days: float) -> str:
    years = f" ({days / 365:,.1f} years)" if days >= 365 else ""
    return f"{days:,.1f} days" if days < 10 else f"{days:,.0f} days{years}"


def endurance_finding(e: Endurance) -> Finding:
    """The endurance claim in words, with its figures."""
    where = f" on {e.rate.device}" if e.rate.device else " per drive"
    per = "of training" if e.rate.device == "" or "step" in e.rate.basis else "at this run's rate"
    parts = [f"{units.volume(e.bytes_per_hour)} written per hour {per}{where}"]
    dwpd = e.drive_writes_per_day
    if dwpd is not None:
        parts.append(f"{dwpd:,.2f} drive writes per day on its {units.volume(e.rate.capacity_bytes)}")
    else:
        parts.append(f"{e.writes_per_day_per_tb:,.2f} drive writes per day per TB of capacity")
    days, tbw = e.days_to_tbw, e.tbw_bytes or 0.0
    if days is not None:
        used = f", {units.volume(e.written_bytes)} already written" if e.written_bytes else ""
        parts.append(f"the rated {units.volume(tbw)} ({e.tbw_source}{used}) lasts {_days(days)} of writing "
                     f"around the clock")
        headline = "; ".join(parts) + "."
    else:
        headline = "; ".join(parts) + "; rated endurance unknown: pass --drive-tbw (e.g. --drive-tbw 600TB)."
    rule = ("written per hour = bytes written per second x 3600 (" + e.rate.basis + "); drive writes per day = "
            "written per day / capacity" + (f" ({e.rate.capacity_source})" if dwpd is not None else
                                            " (capacity unknown: per 10^12 B)")
            + "; days to rated TBW = (TBW - already written) / written per day")
    figures: dict[str, float | int | str | None] = {
        "written_bytes_per_hour": e.bytes_per_hour, "written_bytes_per_day": e.bytes_per_day,
        "drive_writes_per_day": dwpd, "drive_writes_per_day_per_tb": e.writes_per_day_per_tb,
        "capacity_bytes": e.rate.capacity_bytes or None, "tbw_bytes": e.tbw_bytes,
        "tbw_source": e.tbw_source or None, "already_written_bytes": e.written_bytes, "days_to_tbw": days,
        "device": e.rate.device or None,
    }
    return Finding("endurance", headline, rule, figures)


def plan_endurance(plan: Plan, step_s: float | None, tbw_bytes: float | None = None,
                   capacity_bytes: float | None = None, checkpoint: CheckpointPlan | None = None) -> Finding | None:
    """The endurance finding of a planned job (None when it writes nothing to
    NVMe). The step time is `step_s` (--step-time) or, without it, the storage
    time per step at the given drive bandwidth (plus a share of the
    checkpoint's save time): the fastest a storage-bound step can go, so the
    most it can write per hour."""
    ckpt_write = (checkpoint.written_bytes_per_step or 0.0) if checkpoint is not None else 0.0
    if plan.per_optimizer_step.total_write + ckpt_write <= 0:
        return None
    storage_s = (plan.storage_s_per_step or 0.0) + ((checkpoint.seconds_per_step or 0.0) if checkpoint else 0.0)
    if step_s:
        source = "--step-time"
    elif storage_s:
        step_s, source = storage_s, "storage time per step at --drive-bandwidth: an upper bound"
    else:
        per = (plan.per_optimizer_step.total_write + ckpt_write) / plan.inp.drives
        return Finding("endurance", f"{units.volume(per)} written per optimizer step per drive; give --step-time S "
                                    f"(or --drive-bandwidth) for the writes per day and the days to the rated TBW.",
                       "written per step = the planner's NVMe writes per optimizer step / drives",
                       {"written_bytes_per_step": per})
    rate = plan_write_rate(plan, step_s, source, capacity_bytes, checkpoint)
    if rate is None:
        return None
    return endurance_finding(Endurance(rate, tbw_bytes, "--drive-tbw" if tbw_bytes else ""))


def run_endurance(run: TraceRun, inputs: VerdictInputs) -> Finding | None:
    rate = run_write_rate(run, inputs.drive_capacity_bytes)
    if rate is None:
        return None
    return endurance_finding(Endurance(rate, inputs.drive_tbw_bytes, inputs.tbw_source, inputs.drive_written_bytes))
