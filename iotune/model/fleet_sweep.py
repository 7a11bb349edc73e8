"""A multi-node sweep (`iotune sweep --hosts`): what each node's own sweep
found, read from its `iotune sweep --json` document (NodeSweep), and the
fleet's report (FleetSweepReport, built by analysis.fleet_sweep): the slow
nodes and whether the nodes deserve different settings.

Bandwidths are the sweep's score in bytes/s (the harmonic mean of read and
write, as the sweep ranks); a node's measured ceiling is its best point's
median score. Fractions (noise, spread, gap) are plain ratios, 0.05 = 5 %.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .record import JsonRecord, from_fields
from .sweep import SweepPoint

FLEET_SWEEP_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NodeSweep:
    """One node's sweep as the fleet report reads it."""

    host: str
    status: str                                   # ok | failed (no sweep document came back)
    error: str = ""
    recommended: dict[str, Any] | None = None     # the recommended point (SweepPoint.to_json)
    recommended_key: str = ""
    best_key: str = ""                            # the executor's best point
    ceiling_bytes_per_s: float | None = None      # measured ceiling: the best point's median score
    spread: float = 0.0                           # the best point's (max - min) / median over its repeats
    runs: int = 0                                 # the best point's successful repeats (1: spread unmeasured)
    scores: dict[str, float] = field(default_factory=dict)   # point key -> median score, every ranked point
    gain_over_default: float | None = None        # the recommendation against DeepSpeed's defaults (executor)
    step_gain: float | None = None                # median optimizer-step ratio vs the defaults (None: not measured)
    step_verdict: str = ""                        # faster | within noise | slower | undecided ("": not measured)
    fragment: dict[str, Any] = field(default_factory=dict)
    validation_error: str | None = None
    journal: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "error": self.error, "recommended": self.recommended,
                "recommended_key": self.recommended_key, "best_key": self.best_key,
                "ceiling_bytes_per_s": self.ceiling_bytes_per_s, "spread": self.spread, "runs": self.runs, "scores": dict(self.scores),
                "gain_over_default": self.gain_over_default, "step_gain": self.step_gain,
                "step_verdict": self.step_verdict, "fragment": self.fragment,
                "validation_error": self.validation_error, "journal": self.journal}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeSweep:
        return from_fields(cls, data)


def node_sweep_from_doc(host: str, doc: dict[str, Any]) -> NodeSweep:
    """A node's NodeSweep from its `iotune sweep --json` document."""
    ranking = [r for r in doc.get("ranking") or [] if r.get("scores")]
    best = ranking[0] if ranking else None
    step = doc.get("step_gain") or None
    recommended = doc.get("recommended") or None
    rec_key = SweepPoint.from_json(recommended).key() if recommended else ""
    return NodeSweep(
        host=host, status="ok", recommended=recommended, recommended_key=rec_key,
        best_key=best["key"] if best else "",
        ceiling_bytes_per_s=float(best["median"]) if best else None,
        spread=float(best.get("spread", 0.0)) if best else 0.0, runs=len(best["scores"]) if best else 0,
        scores={r["key"]: float(r["median"]) for r in ranking},
        gain_over_default=doc.get("gain_over_default"),
        step_gain=float(step["median"]) if step else None, step_verdict=step["verdict"] if step else "",
        fragment=doc.get("fragment") or {}, validation_error=doc.get("validation_error"),
        journal=doc.get("journal", ""))


@dataclass(frozen=True)
class NodeJudgement(JsonRecord):
    """One node against the fleet: is its measured ceiling more than its
    noise below the median of the nodes' ceilings?"""

    host: str
    noise: float                     # max(the profile's noise floor, the node's spread)
    below_median: float | None       # 1 - ceiling / median (negative: above it; None: no ceiling)
    slow: bool                       # below_median > noise


@dataclass(frozen=True)
class PickComparison(JsonRecord):
    """A node's own pick against another node's different pick, on the
    node's own measurements."""

    host: str
    other_host: str
    own_key: str
    other_key: str
    own_over_other: float | None     # own pick's score / other pick's score on this node (None: not measured here)
    noise: float
    beats: bool | None               # own_over_other > 1 + noise (None: not measured here)


@dataclass(frozen=True)
class FleetSweepReport:
    """The fleet's sweep: every node's outcome and what comparing them shows."""

    profile: str
    executor: str
    path: str
    noise_floor: float
    nodes: tuple[NodeSweep, ...]
    judged: tuple[NodeJudgement, ...]
    median_ceiling_bytes_per_s: float | None
    slow: tuple[str, ...]            # hosts flagged slow
    settings: str                    # same | different | within noise | not comparable | n/a
    comparisons: tuple[PickComparison, ...]
    summary: str                     # the findings in words
    started_at: str = ""
    duration_s: float | None = None
    schema: int = FLEET_SWEEP_SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "kind": "fleet-sweep", "profile": self.profile, "executor": self.executor,
                "path": self.path, "noise_floor": self.noise_floor, "started_at": self.started_at,
                "duration_s": self.duration_s, "median_ceiling_bytes_per_s": self.median_ceiling_bytes_per_s,
                "slow": list(self.slow), "settings": self.settings, "summary": self.summary,
                "nodes": [n.to_json() for n in self.nodes], "judged": [j.to_json() for j in self.judged],
                "comparisons": [c.to_json() for c in self.comparisons]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FleetSweepReport:
        return cls(profile=data.get("profile", ""), executor=data.get("executor", ""), path=data.get("path", ""),
                   noise_floor=float(data.get("noise_floor", 0.0)),
                   nodes=tuple(NodeSweep.from_json(n) for n in data.get("nodes", [])),
                   judged=tuple(NodeJudgement.from_json(j) for j in data.get("judged", [])),
                   median_ceiling_bytes_per_s=data.get("median_ceiling_bytes_per_s"),
                   slow=tuple(data.get("slow", [])), settings=data.get("settings", "n/a"),
                   comparisons=tuple(PickComparison.from_json(c) for c in data.get("comparisons", [])),
                   summary=data.get("summary", ""), started_at=data.get("started_at", ""),
                   duration_s=data.get("duration_s"), schema=int(data.get("schema", FLEET_SWEEP_SCHEMA_VERSION)))
