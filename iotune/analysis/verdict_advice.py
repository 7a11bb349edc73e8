"""What to do about a storage-bound step, and what it buys.

- in flight: the dominant request size x the mean in-flight depth the block
  histograms saw, against what the drive needs to reach its ceiling at the
  latency the job saw (Little's law: bytes in flight = bandwidth x latency).
  A drive already at NEAR_CEILING of its ceiling while busy (the steady
  steps' bandwidth, as device_use compares it) needs no deeper queue: more
  or faster drives are the remedy.
- what-if: the optimizer step with N drives striped (RAID0) = its time
  without I/O + its bytes / (N x bandwidth per drive), the planner's storage
  time (`iotune plan --drives N`), from the bytes measured per steady step;
  per drive at its ceiling (the job-pattern one when measured, which is what
  this job's swap I/O can reach on such a drive), else at the bandwidth
  measured while busy.
"""

from __future__ import annotations

import statistics

from ..model import units
from ..model.run import TraceRun
from ..model.verdict import DeviceCeiling, Finding, VerdictInputs
from .attribution import StepBreakdown, Window
from .device_use import (BRIDGE_S, CEILING_HINT, InFlight, busiest, ceiling_of, device_use, in_flight, share_of_ceiling,
                         steady_use)
from .planner import striped_seconds

NEAR_CEILING = 0.8       # bandwidth while busy at this share of the ceiling: the drive is saturated
WHAT_IF_DRIVES = (2, 4)  # multiples of the drives traced
SWEEP = "iotune sweep --path NVME_PATH"


def storage_advice(run: TraceRun, inputs: VerdictInputs, rows: list[StepBreakdown], optimizer_s: float,
                   optimizer_compute_s: float) -> list[Finding]:
    dev = busiest(run)
    if dev is None:
        return []
    steady = steady_use(run, dev.name, BRIDGE_S)
    rate = steady.bytes_per_s if steady is not None else device_use(run, dev.name, BRIDGE_S).bytes_per_s
    ceiling = ceiling_of(inputs, dev.name)
    out = []
    flight = in_flight(dev)
    if flight is not None:
        out.append(in_flight_finding(flight, rate, ceiling.bytes_per_s if ceiling else None,
                                     share_of_ceiling(rate, ceiling) if ceiling else None))
    opt = [r.block_by_phase.get("optimizer", Window()) for r in rows]
    moved = float(statistics.median(w.read_bytes + w.write_bytes for w in opt)) if opt else 0.0
    per_drive = ceiling.bytes_per_s if ceiling else rate
    source = _per_drive_source(ceiling)
    drives = sum(1 for d in run.devices if not d.is_lower and any(d.direction(op).bytes for op in ("read", "write")))
    if moved > 0 and per_drive > 0:
        out.append(what_if_finding(moved, per_drive, source, optimizer_s, optimizer_compute_s, max(1, drives)))
    return out


def _per_drive_source(ceiling: DeviceCeiling | None) -> str:
    if ceiling is None:
        return "the bandwidth measured while busy (ceiling unknown)"
    if ceiling.job is not None:
        return "its ceiling, this job's swap pattern replayed"
    return f"its ceiling ({ceiling.source})" if ceiling.cap else f"its ceiling ({ceiling.source}; not this job's pattern)"


def in_flight_finding(f: InFlight, busy_bytes_per_s: float, ceiling: float | None,
                      share: float | None = None) -> Finding:
    """`share`: busy_bytes_per_s's share of the ceiling as reports show it (at most 1; default: the plain ratio, capped)."""
    seen = (f"{f.device}: queue depth {f.mean_depth:.1f} × {units.size(f.request_bytes)} requests keeps "
            f"{units.mib(f.bytes)} in flight")
    figures: dict[str, float | int | str | None] = {
        "device": f.device, "request_bytes": f.request_bytes, "mean_depth": f.mean_depth,
        "in_flight_bytes": f.bytes, "mean_latency_s": f.mean_lat_s, "bytes_per_s_busy": busy_bytes_per_s,
        "ceiling_bytes_per_s": ceiling, "needed_in_flight_bytes": None}
    rule = (f"in flight = dominant request size × mean in-flight depth at issue; needed = ceiling × mean latency "
            f"(Little's law); at {NEAR_CEILING:.0%} of the ceiling or more the drive is saturated and a deeper "
            f"queue only adds latency")
    if ceiling is None:
        figures["action"] = "measure the drive's ceiling (--ceiling)"
        return Finding("advice", f"{seen}; what this drive needs is unknown without its ceiling — {CEILING_HINT}.",
                       rule, figures)
    shown = min(1.0, busy_bytes_per_s / ceiling) if share is None else share
    if busy_bytes_per_s >= NEAR_CEILING * ceiling:
        figures["action"] = "add drives (RAID0) or use a faster drive"
        return Finding("advice", f"{seen}, and the drive runs at {shown:.0%} of its "
                                 f"ceiling while busy: a deeper queue will not help, more or faster drives will.",
                       rule, figures)
    if f.mean_lat_s is None:
        figures["action"] = f"sweep the aio settings ({SWEEP})"
        return Finding("advice", f"{seen}; no latency was recorded to size the queue — run `{SWEEP}`.",
                       rule, figures)
    need = ceiling * f.mean_lat_s
    figures["needed_in_flight_bytes"] = need
    if need > f.bytes:
        figures["action"] = f"raise aio queue_depth or block_size ({SWEEP})"
        return Finding("advice", f"{seen}; at the {f.mean_lat_s * 1e3:.2f} ms per request seen, this drive needs "
                                 f"≥ {units.mib(need)} in flight to reach its {units.mb_s(ceiling)} — raise the aio "
                                 f"queue_depth or block_size: run `{SWEEP}`.", rule, figures)
    figures["action"] = f"sweep the aio settings ({SWEEP})"
    return Finding("advice", f"{seen}, at least the {units.mib(need)} this drive needs, yet it runs at "
                             f"{shown:.0%} of its ceiling while busy: the gap is not queue "
                             f"depth (request size, the filesystem, the CPU side) — run `{SWEEP}`.", rule, figures)


def what_if_finding(moved: float, per_drive: float, source: str, optimizer_s: float, compute: float,
                    drives: int = 1) -> Finding:
    """The optimizer step on `drives` drives (as traced, each at `per_drive`) and on WHAT_IF_DRIVES times as many."""
    counts = (drives, *(k * drives for k in WHAT_IF_DRIVES))
    est = {n: compute + striped_seconds(moved, per_drive, n) for n in counts}
    alts = ", ".join(f"with {n} drives in RAID0 ≈ {est[n]:.2f} s" for n in counts[1:])
    head = (f"The optimizer step takes {optimizer_s:.2f} s now; {alts} ({drives} drive(s) at "
            f"{units.mb_s(per_drive)} each: ≈ {est[drives]:.2f} s): it moves {units.mb(moved)} MB per step.")
    rule = ("optimizer step with N drives = its time without I/O + its block bytes / (N × bandwidth per drive), "
            f"as `iotune plan --drives N` computes storage time; bandwidth per drive: {source}; the traced drives "
            f"that moved data count as the drives now")
    figures: dict[str, float | int | str | None] = {
        "optimizer_s": optimizer_s, "optimizer_compute_s": compute, "optimizer_bytes": moved,
        "drive_bytes_per_s": per_drive, "drive_bandwidth_source": source, "drives_now": drives,
        **{f"optimizer_s_with_{n}_drives": est[n] for n in counts}}
    return Finding("advice", head, rule, figures)
