"""A multi-node run's report: each node's figures and verdict, the slowest
node of every step, the straggler and the aggregate bandwidth.

Rules:
- a node's figures come from its lowest rank that recorded phases (the
  single-node analysis reads rank 0, so that rank is relabelled 0 for it);
  each node's times are its own CLOCK_MONOTONIC, so only durations are
  compared across nodes, and step numbers (engine.global_steps) join them.
- per step: every global step recorded by two or more ok nodes; its
  slowest node, the median step time of the others and the gap.
- per step, "slowest" is by step time when the nodes' step times differ by
  more than NOISE_PCT; else (synchronous training makes them equal: every
  rank waits for the slowest in its collectives) by the time each node's
  drives were busy inside the step (analysis.verdict.step_stalls), the gap
  then in seconds of storage time and in percent of the step.
- the straggler: the node slowest in the most steps (ties: the larger
  median gap, then the host name); it stands out when its median steady step
  is more than NOISE_PCT longer than the median of the other nodes', or
  (by storage) when its median gap is more than NOISE_PCT of the step.
- aggregate bandwidth: block bytes (read + write, top-level devices) summed
  over the ok nodes / the fleet's wall time.
- failed and lost nodes are listed with their error and left out of every
  aggregate.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from ..model import units
from ..model.attribution import Attribution
from ..model.fleet import FleetRun, NodeRun
from ..model.fleet_report import FleetNodeRow, FleetRankRow, FleetReport, StepStraggler, StragglerSummary
from ..model.run import TraceRun
from ..model.verdict import VerdictInputs
from .attribution import StepBreakdown, median_step, steady, step_breakdowns, swap_by_category
from .device_use import BRIDGE_S, busy_spans, length, timeline_index
from .summary import totals
from .verdict import judge, step_stalls

NOISE_PCT = 5.0     # a straggler's median step must be this much longer than the others' to stand out


def _median(values: Iterable[float]) -> float | None:
    vals = list(values)
    return float(statistics.median(vals)) if vals else None


def phase_ranks(run: TraceRun) -> tuple[int, ...]:
    """The ranks that recorded training phases, in order."""
    return tuple(sorted({p.rank for p in run.attribution.phases})) if run.attribution else ()


def as_rank0(run: TraceRun, rank: int) -> TraceRun:
    """`run` with ranks `rank` and 0 swapping labels, so the single-node
    analysis (which reads rank 0) reads `rank`."""
    att = run.attribution
    if att is None or rank == 0:
        return run

    def swap(r: int) -> int:
        return 0 if r == rank else rank if r == 0 else r

    return replace(run, attribution=Attribution(
        tuple(replace(p, rank=swap(p.rank)) for p in att.phases),
        tuple(replace(s, rank=swap(s.rank)) for s in att.swaps),
        tuple(sorted(swap(r) for r in att.ranks)), dict(att.swap_files)))


def node_view(node: NodeRun) -> TraceRun | None:
    """The node's run as the single-node analysis should read it: its
    lowest rank with phases as rank 0 (None: the node has no run)."""
    if node.run is None:
        return None
    ranks = phase_ranks(node.run)
    mine = [r for r in ranks if r in node.ranks] or list(ranks)
    return as_rank0(node.run, mine[0]) if mine else node.run


def busy_rate(run: TraceRun) -> float | None:
    """Bytes on the top-level devices / the time they were busy."""
    top = {d.name for d in run.devices if not d.is_lower}
    moved = sum(n for (dev, op), n in timeline_index(run).moved.items() if dev in top and op in ("read", "write"))
    busy = length(busy_spans(run, bridge_s=BRIDGE_S))
    return moved / busy if busy > 0 and moved else None


def node_row(node: NodeRun, inputs: VerdictInputs = VerdictInputs()) -> FleetNodeRow:
    run = node_view(node)
    if run is None:
        return FleetNodeRow(node.host, node.status, node.error, node.ranks, 0, None, None, None, None, None,
                            None, None, None, None, None)
    rows = step_breakdowns(run)
    med = median_step(rows)
    cats = swap_by_category(run)
    t = totals(run)
    verdict = judge(run, inputs)
    return FleetNodeRow(
        node.host, node.status, node.error, node.ranks or phase_ranks(node.run or run), len(rows),
        med.total_s if med else None, med.optimizer_s if med else None,
        med.read_bytes if med else None, med.write_bytes if med else None,
        sum(c.read_bytes_per_step + c.write_bytes_per_step for c in cats) if med else None,
        t.read_bytes + t.write_bytes, run.duration_s, busy_rate(run), verdict.limit, verdict.summary)


def rank_rows(node: NodeRun) -> list[FleetRankRow]:
    """One row per rank of the node that recorded phases."""
    run = node.run
    if run is None or run.attribution is None:
        return []
    out = []
    for rank in phase_ranks(run):
        rows = step_breakdowns(run, rank)
        stable = {r.step for r in steady(rows)}
        per_step = [sum(s.bytes for s in run.attribution.swaps if s.rank == rank and s.step == k and s.phase)
                    for k in sorted(stable)]
        med = median_step(rows)
        out.append(FleetRankRow(node.host, rank, len(rows), med.total_s if med else None,
                                med.optimizer_s if med else None, _median(per_step)))
    return out


def step_times(fleet: FleetRun) -> dict[str, dict[int, tuple[float, float]]]:
    """Per ok node, by global step: (step time, time its drives were busy
    inside the step's phases)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for node in fleet.ok_nodes:
        run = node_view(node)
        rows: list[StepBreakdown] = step_breakdowns(run) if run is not None else []
        stalls = step_stalls(run, rows) if run is not None else []
        out[node.host] = {st.step: (st.total_s, st.stall_s) for st in stalls}
    return out


def step_stragglers(times: dict[str, dict[int, tuple[float, float]]] | dict[str, dict[int, float]]
                    ) -> list[StepStraggler]:
    """The slowest node of each step recorded by two or more nodes (ties:
    the first host in order). By step time when the nodes' step times differ
    by more than NOISE_PCT; else (synchronous training: every rank waits for
    the slowest in its collectives, so the step times come out equal) by the
    time each node's drives were busy in the step: the node waiting on its
    own storage is the one the others wait for."""
    out = []
    for step in sorted({k for per in times.values() for k in per}):
        here = [(host, _pair(per[step])) for host, per in times.items() if step in per]
        if len(here) < 2:
            continue
        host, (step_s, _) = max(here, key=lambda hs: hs[1][0])
        others = float(statistics.median(t for h, (t, _) in here if h != host))
        if others > 0 and 100.0 * (step_s - others) / others > NOISE_PCT:
            out.append(StepStraggler(step, len(here), host, step_s, others, step_s - others,
                                     100.0 * (step_s - others) / others))
            continue
        host, (step_s, stall) = max(here, key=lambda hs: hs[1][1])
        others_stall = float(statistics.median(b for h, (_, b) in here if h != host))
        gap = stall - others_stall
        out.append(StepStraggler(step, len(here), host, step_s, others, gap,
                                 100.0 * gap / step_s if step_s > 0 else None, basis="storage",
                                 stall_s=stall, others_stall_s=others_stall))
    return out


def _pair(t: tuple[float, float] | float) -> tuple[float, float]:
    """(step time, drive-busy time); a bare step time has no busy time."""
    return t if isinstance(t, tuple) else (t, 0.0)


def straggler_summary(steps: list[StepStraggler], rows: list[FleetNodeRow]) -> StragglerSummary | None:
    if not steps:
        return None
    counts = Counter(s.host for s in steps)

    def gap_of(host: str) -> float:
        return float(statistics.median(s.gap_s for s in steps if s.host == host))

    host = min(counts, key=lambda h: (-counts[h], -gap_of(h), h))
    ok = {r.host: r for r in rows if r.status == "ok"}
    me = ok.get(host)
    others = [r for h, r in ok.items() if h != host]
    others_step = _median(r.step_s for r in others if r.step_s is not None)
    others_busy = _median(r.busy_bytes_per_s for r in others if r.busy_bytes_per_s is not None)
    step_s = me.step_s if me else None
    mine = [s for s in steps if s.host == host]
    by_storage = sum(s.basis == "storage" for s in mine) > len(mine) / 2
    if by_storage:      # equal step times: it stands out when its drives hold each step longer
        pcts_mine = [s.gap_pct for s in mine if s.gap_pct is not None]
        stands_out = bool(pcts_mine) and float(statistics.median(pcts_mine)) > NOISE_PCT
    else:
        stands_out = (step_s is not None and others_step is not None and others_step > 0
                      and 100.0 * (step_s - others_step) / others_step > NOISE_PCT)
    pcts = [s.gap_pct for s in steps if s.gap_pct is not None]
    return StragglerSummary(host, counts[host], len(steps), float(statistics.median(s.gap_s for s in steps)),
                            _median(pcts), step_s, others_step, me.busy_bytes_per_s if me else None,
                            others_busy, stands_out, basis="storage" if by_storage else "step",
                            stall_s=_median(s.stall_s for s in mine if s.stall_s is not None),
                            others_stall_s=_median(s.others_stall_s for s in mine if s.others_stall_s is not None))


def wall_time(fleet: FleetRun) -> float:
    """The fleet's wall time, else the longest ok node's run."""
    if fleet.duration_s > 0:
        return fleet.duration_s
    return max((n.run.duration_s for n in fleet.ok_nodes if n.run is not None), default=0.0)


def fleet_report(fleet: FleetRun, inputs: VerdictInputs = VerdictInputs()) -> FleetReport:
    """The report of `fleet`; `inputs` apply to every node's verdict."""
    rows = [node_row(n, inputs) for n in fleet.nodes]
    ranks = [r for n in fleet.ok_nodes for r in rank_rows(n)]
    steps = step_stragglers(step_times(fleet))
    summary = straggler_summary(steps, rows)
    moved = sum(r.block_bytes or 0 for r in rows if r.status == "ok" and r.block_bytes is not None)
    wall = wall_time(fleet)
    rate = moved / wall if wall > 0 else 0.0
    return FleetReport(fleet, tuple(rows), tuple(ranks), tuple(steps), summary, wall, moved, rate,
                       fleet_words(rows, steps, summary, rate))


def straggler_words(s: StragglerSummary) -> str:
    if not s.stands_out:
        gap = f" ({s.median_gap_pct:.1f} %)" if s.median_gap_pct is not None else ""
        return (f"No node stands out: the slowest node of each of {s.compared_steps} step(s) is a median "
                f"{s.median_gap_s:.3f} s{gap} behind the others, and no node's median step is more than "
                f"{NOISE_PCT:g} % longer than the others'.")
    head = f"Node {s.host} is the straggler in {s.slowest_steps} of {s.compared_steps} steps"
    if s.basis == "storage" and s.stall_s is not None and s.others_stall_s is not None and s.step_s:
        head += (f": every node's step takes about {s.step_s:.2f} s (synchronous training: the others wait for "
                 f"it in their collectives), but its drives are busy {s.stall_s:.2f} s of each step vs "
                 f"{s.others_stall_s:.2f} s on the others ({100.0 * (s.stall_s - s.others_stall_s) / s.step_s:+.0f} % "
                 f"of the step)")
    elif s.step_s is not None and s.others_step_s:
        pct = 100.0 * (s.step_s - s.others_step_s) / s.others_step_s
        head += f": its steps take {s.step_s:.2f} s vs {s.others_step_s:.2f} s on the others ({pct:+.0f} %)"
    if s.busy_bytes_per_s is not None and s.others_busy_bytes_per_s is not None:
        head += (f"; its drive moved {units.mb_s(s.busy_bytes_per_s)} while busy vs "
                 f"{units.mb_s(s.others_busy_bytes_per_s)} on the others")
    return head + "."


def fleet_words(rows: list[FleetNodeRow], steps: list[StepStraggler], s: StragglerSummary | None,
                rate: float) -> str:
    """The fleet's verdict in words."""
    ok = [r for r in rows if r.status == "ok"]
    missing = "".join(f" {r.host} {r.status}: {r.error or 'no reason recorded'}." for r in rows
                      if r.status != "ok")
    if not ok:
        return f"No node returned a complete run ({len(rows)} node(s)).{missing}"
    if s is not None:
        head = straggler_words(s)
    elif len(ok) == 1:
        head = f"Only {ok[0].host} returned a complete run: no other node to compare it with."
    else:
        head = "No training step was recorded on two or more nodes: no straggler to name."
    return f"{head} Aggregate {units.gb(rate)} GB/s over {len(ok)} ok node(s).{missing}"
