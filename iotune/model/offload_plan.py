"""The offload search's plan within its budget, and what its replays ranked
(iotune.sweep.offload.replay_rank): records of `iotune sweep offload`,
produced by iotune.sweep.offload, rendered by iotune.render.offload.

The plan is fitted to the budget in this order, each part at its measured
cost (a real-step trial: the reference trial's wall time; a replay batch:
the fidelity replays' child, its start-up and layout included):

  1. the replay ranking, its first look (3 ABBA pairs) for every replayable
     candidate: the cheapest information, so first;
  2. the first look of the pick's confirmation on real steps (3 pairs: the
     rule cannot decide from fewer);
  3. the real-step trials of the candidates the replay cannot represent,
     those predicted fastest first;
  4. further confirmation pairs, up to --max-pairs.

What does not fit is cut, and said (`cut`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .budget_fit import FIRST_LOOK_PAIRS, PlanJson, parts_that_fit
from .record import from_fields
from .sweep_result import more_pairs_phrase
from . import units



@dataclass(frozen=True)
class PlanCosts:
    """What each part of a search costs, measured before the plan."""

    trial_s: float                     # one real-step trial (the reference trial's wall time)
    replay_batch_s: float              # one candidate's first look on replays (FIRST_LOOK_PAIRS ABBA pairs)
    spent_s: float                     # already spent (the reference trial, the fidelity replays)


@dataclass(frozen=True)
class SearchPlan(PlanJson):
    """What the search will run, fitted to its budget, and the estimated time."""

    budget_s: float
    budget_source: str                 # "--budget 45m" or how the default was derived
    trial_s: float
    spent_s: float
    replay_candidates: int             # ranked on replays
    replay_s: float
    real_trials: int                   # run on real steps (candidates the replay cannot represent)
    real_s: float
    max_pairs: int                     # the pick's confirmation pairs, at most
    pairs_s: float
    cut: tuple[str, ...] = ()          # what the budget cut, in words

    @property
    def estimated_s(self) -> float:
        return self.spent_s + self.replay_s + self.real_s + self.pairs_s

    def describe(self) -> list[str]:
        """The plan as the search prints it before it starts."""
        lines = [f"plan within {units.duration(self.budget_s)} ({self.budget_source}); spent so far "
                 f"{units.duration(self.spent_s)} (the reference trial and the fidelity replays)",
                 f"  replays: {self.replay_candidates} candidate(s) ranked against your config, at least "
                 f"{FIRST_LOOK_PAIRS} ABBA pairs of replays each (≈ {units.duration(self.replay_s)})",
                 f"  real steps: {self.real_trials} candidate trial(s) the replay cannot represent (≈ "
                 f"{units.duration(self.real_s)}), then at most {self.max_pairs} pair(s) confirming the pick "
                 f"(≈ {units.duration(self.pairs_s)}) at {units.duration(self.trial_s)} a trial",
                 f"  estimated: {units.duration(self.estimated_s)} of {units.duration(self.budget_s)}"]
        return lines + [f"  cut to fit the budget: {c}" for c in self.cut]



def fit_plan(budget_s: float, source: str, costs: PlanCosts, replayable: int, real: int,
             max_pairs: int, journaled: int = 0) -> SearchPlan:
    """The plan for `replayable` candidates on replays (`journaled` of them already in the
    journal: free), `real` on real steps and at most `max_pairs` confirmation pairs, cut (in
    the module's order) to what `budget_s` holds."""
    left = budget_s - costs.spent_s
    ranked = journaled + parts_that_fit(left, costs.replay_batch_s, replayable - journaled)
    left -= (ranked - journaled) * costs.replay_batch_s
    pair_s = 2 * costs.trial_s
    first = parts_that_fit(left, pair_s, min(FIRST_LOOK_PAIRS, max_pairs))
    left -= first * pair_s
    trials = parts_that_fit(left, costs.trial_s, real)
    left -= trials * costs.trial_s
    pairs = first + parts_that_fit(left, pair_s, max_pairs - first)
    cut = []
    if ranked < replayable:
        cut.append(f"{ranked} of {replayable} replayable candidates ranked on replays")
    if trials < real:
        cut.append(f"{trials} of {real} real-step candidate trials")
    if pairs < max_pairs:
        cut.append(f"at most {pairs} confirmation pair(s), not {max_pairs}"
                   + (f" (the rule decides from {FIRST_LOOK_PAIRS}: the pick will stay undecided)"
                      if pairs < FIRST_LOOK_PAIRS else ""))
    return SearchPlan(budget_s, source, costs.trial_s, costs.spent_s, ranked,
                      (ranked - journaled) * costs.replay_batch_s,
                      trials, trials * costs.trial_s, pairs, pairs * pair_s, tuple(cut))


@dataclass(frozen=True)
class ReplayRank:
    """A candidate ranked on replays of its derived schedule, in ABBA pairs with
    your config's (the sequential rule on reference / candidate seconds)."""

    key: str                             # the candidate's changed keys, as JSON (the trials' key)
    changes: dict[str, Any]
    seconds: tuple[float, ...]           # its replays, in the order they ran
    reference_seconds: tuple[float, ...]  # your config's replays, paired with them
    verdict: str                         # faster | within noise | slower | undecided
    decision: str = ""                   # the rule's account, in words

    @property
    def median_s(self) -> float:
        return _median(self.seconds)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median of its replays."""
        return (max(self.seconds) - min(self.seconds)) / self.median_s if self.seconds and self.median_s else 0.0

    @property
    def ratio(self) -> float:
        """Your config's median replay seconds / the candidate's (above 1: the candidate is faster)."""
        return _median(self.reference_seconds) / self.median_s if self.median_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": list(self.seconds), "reference_seconds": list(self.reference_seconds),
                "median_s": self.median_s, "spread": self.spread, "ratio": self.ratio}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayRank:
        return from_fields(cls, {**data, "seconds": tuple(data.get("seconds") or ()),
                                 "reference_seconds": tuple(data.get("reference_seconds") or ())})


def _median(xs: tuple[float, ...]) -> float:
    s = sorted(xs)
    return 0.0 if not s else s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


@dataclass(frozen=True)
class ReplayOutcome:
    """The replay's part of a search: whether it could rank (fidelity), what it
    ranked (fastest first), its pick, and what was left to real steps and why."""

    can_rank: bool
    fidelity: str                               # the check in words, or why there was no replay
    traced_ratio: float = 0.0                   # the traced schedule's replay / the traced step
    derived_ratio: float = 0.0                  # your config's derived schedule's replay / the traced window
    ranked: tuple[ReplayRank, ...] = ()         # the fastest first: by ratio to your config's replays
    pick: str = ""                              # the key the replay sends to the real-step pairs ("": none)
    real_steps: tuple[tuple[str, str], ...] = ()   # (changes in words, why not replayed)

    def to_json(self) -> dict[str, Any]:
        return {"can_rank": self.can_rank, "fidelity": self.fidelity, "traced_ratio": self.traced_ratio,
                "derived_ratio": self.derived_ratio, "ranked": [r.to_json() for r in self.ranked],
                "pick": self.pick, "real_steps": [{"changes": c, "why": w} for c, w in self.real_steps]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayOutcome:
        return cls(bool(data.get("can_rank")), str(data.get("fidelity", "")), float(data.get("traced_ratio", 0.0)),
                   float(data.get("derived_ratio", 0.0)),
                   tuple(ReplayRank.from_json(r) for r in data.get("ranked") or ()), str(data.get("pick", "")),
                   tuple((str(r["changes"]), str(r["why"])) for r in data.get("real_steps") or ()))


def undecided_pairs(name: str, more: int, seconds: float, least: bool = False,
                    against: str = "your config") -> str:
    """"undecided: sub_group_size=100000000 vs your config: about 4 more pairs (≈ 12 min)"
    (`least`: at least that many: no noise estimate yet)."""
    return f"undecided: {name} vs {against}: {more_pairs_phrase(more, seconds, least) or 'no pair ran'}"


def undecided_unrun(name: str, what: str, seconds: float, against: str = "your config") -> str:
    """"undecided: pipeline_read=True vs your config: not run on real steps (≈ 3.1 min)"."""
    return f"undecided: {name} vs {against}: {what} (≈ {units.duration(seconds)})"


@dataclass(frozen=True)
class ReplayBatch:
    """One replayer child's replays, journaled as it ends: the schedules `order`
    named (0: your config's, 1: the candidate's; for the fidelity check 0: the
    traced step's, 1: your config's derived one), their seconds in that order,
    and the child's wall time, start-up and layout included (a plan's cost)."""

    key: str                             # the candidate's key, or "fidelity"
    batch: int
    order: tuple[int, ...]
    seconds: tuple[float, ...]
    wall_s: float = 0.0

    def of(self, index: int) -> tuple[float, ...]:
        return tuple(s for i, s in zip(self.order, self.seconds) if i == index)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "order": list(self.order), "seconds": list(self.seconds)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayBatch:
        return cls(str(data["key"]), int(data["batch"]), tuple(int(i) for i in data["order"]),
                   tuple(float(s) for s in data["seconds"]), float(data.get("wall_s", 0.0)))
