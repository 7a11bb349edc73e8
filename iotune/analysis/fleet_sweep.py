"""The multi-node sweep's report: each node's own sweep compared with the
others' (pure: NodeSweep records in, a FleetSweepReport out).

Rules:
- a node's noise is max(the profile's noise_floor, the spread of its best
  point over its repeats), the band the sweep itself could not resolve on
  that node.
- slow: a node whose measured ceiling (its best point's median score) is
  more than its noise below the median of the ok nodes' ceilings:
  1 - ceiling / median > noise. Needs two or more ok nodes.
- different settings: the ok nodes' recommended points differ, and for some
  two nodes A and B with different picks, A's pick beats B's pick on A's own
  measurements by more than A's noise (score ratio > 1 + noise) AND B's pick
  beats A's on B's by more than B's noise. "within noise": the picks differ
  but no two nodes each need their own (every cross comparison measured);
  "not comparable": the picks differ and a node did not measure another's
  pick (the adaptive search skips points), so the report cannot tell.
- failed nodes are listed with their error and left out of every comparison.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from ..model import units
from ..model.fleet_sweep import FleetSweepReport, NodeJudgement, NodeSweep, PickComparison


def node_noise(node: NodeSweep, noise_floor: float) -> float:
    return max(noise_floor, node.spread)


def judge_nodes(nodes: Sequence[NodeSweep], noise_floor: float) -> tuple[float | None, tuple[NodeJudgement, ...]]:
    """(median ceiling of the ok nodes, each ok node against it)."""
    measured = [n for n in nodes if n.status == "ok" and n.ceiling_bytes_per_s]
    median = statistics.median(n.ceiling_bytes_per_s or 0.0 for n in measured) if len(measured) >= 2 else None
    judged = []
    for n in nodes:
        if n.status != "ok":
            continue
        noise = node_noise(n, noise_floor)
        below = 1 - (n.ceiling_bytes_per_s or 0.0) / median if median and n.ceiling_bytes_per_s else None
        judged.append(NodeJudgement(host=n.host, noise=noise, below_median=below,
                                    slow=below is not None and below > noise))
    return median, tuple(judged)


def compare_picks(nodes: Sequence[NodeSweep], noise_floor: float) -> tuple[PickComparison, ...]:
    """Each ok node's pick against every different pick of another node
    (once per different pick: the first node holding it), on its own scores."""
    ok = [n for n in nodes if n.status == "ok" and n.recommended_key]
    out = []
    for n in ok:
        own = n.scores.get(n.recommended_key)
        noise = node_noise(n, noise_floor)
        seen: set[str] = set()
        for other in ok:
            key = other.recommended_key
            if key == n.recommended_key or key in seen:
                continue
            seen.add(key)
            theirs = n.scores.get(key)
            ratio = own / theirs if own and theirs else None
            out.append(PickComparison(host=n.host, other_host=other.host, own_key=n.recommended_key, other_key=key,
                                      own_over_other=ratio, noise=noise,
                                      beats=None if ratio is None else ratio > 1 + noise))
    return tuple(out)


def settings_verdict(nodes: Sequence[NodeSweep], comparisons: Sequence[PickComparison]) -> str:
    keys = {n.recommended_key for n in nodes if n.status == "ok" and n.recommended_key}
    if len([n for n in nodes if n.status == "ok" and n.recommended_key]) < 2:
        return "n/a"
    if len(keys) == 1:
        return "same"
    beats = {(c.host, c.other_key): c.beats for c in comparisons}
    owner = {n.host: n.recommended_key for n in nodes if n.status == "ok" and n.recommended_key}
    for c in comparisons:
        if c.beats and beats.get((c.other_host, owner[c.host])):
            return "different"
    return "not comparable" if any(c.beats is None for c in comparisons) else "within noise"


def fleet_sweep_report(nodes: Sequence[NodeSweep], noise_floor: float, profile: str, executor: str, path: str,
                       started_at: str = "", duration_s: float | None = None) -> FleetSweepReport:
    median, judged = judge_nodes(nodes, noise_floor)
    comparisons = compare_picks(nodes, noise_floor)
    settings = settings_verdict(nodes, comparisons)
    slow = tuple(j.host for j in judged if j.slow)
    report = FleetSweepReport(profile=profile, executor=executor, path=path, noise_floor=noise_floor,
                              nodes=tuple(nodes), judged=judged, median_ceiling_bytes_per_s=median, slow=slow,
                              settings=settings, comparisons=comparisons, summary="", started_at=started_at,
                              duration_s=duration_s)
    return replace(report, summary=summary(report))


SETTINGS_WORDS = {
    "same": "every node recommends the same settings: one config serves the fleet",
    "different": "the nodes deserve different settings: {pairs}",
    "within noise": "the nodes' picks differ, but no two nodes each beat the other's pick beyond their noise: "
                    "any one of the picks serves the fleet within the noise",
    "not comparable": "the nodes' picks differ and some node did not measure another's pick (the adaptive "
                      "search skips points): re-run with --grid to tell whether they deserve different settings",
    "n/a": "fewer than two nodes recommended settings: nothing to compare",
}


def summary(r: FleetSweepReport) -> str:
    """The findings in words, one per line."""
    lines = []
    failed = [n for n in r.nodes if n.status != "ok"]
    ok = len(r.nodes) - len(failed)
    for j in r.judged:
        if j.slow and j.below_median is not None:
            node = next(n for n in r.nodes if n.host == j.host)
            lines.append(f"host {j.host} is slow: measured ceiling {units.mb_s(node.ceiling_bytes_per_s)}, "
                         f"{100 * j.below_median:.0f}% below the median {units.mb_s(r.median_ceiling_bytes_per_s)} of "
                         f"{ok} nodes (its noise: {100 * j.noise:.0f}%); check its drive")
    if r.median_ceiling_bytes_per_s is not None and not r.slow:
        lines.append(f"no node is slower than the median {units.mb_s(r.median_ceiling_bytes_per_s)} beyond its noise")
    pairs = "; ".join(f"on {c.host} its own pick beats {c.other_host}'s by {100 * ((c.own_over_other or 1) - 1):.0f}% "
                      f"(noise {100 * c.noise:.0f}%)" for c in r.comparisons if c.beats)
    lines.append(SETTINGS_WORDS[r.settings].format(pairs=pairs))
    single = [n.host for n in r.nodes if n.status == "ok" and n.runs == 1]
    if single and (r.slow or r.settings == "different"):
        lines.append(f"(one repeat on {', '.join(single)}: its noise is the profile's floor alone, the spread is "
                     f"unmeasured; --repeats 3 measures it)")
    lines += [f"host {n.host} failed: {n.error}" for n in failed]
    return "\n".join(lines)
