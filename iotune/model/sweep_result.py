"""What a sweep produces: ranked points, the outcome of one sweep, progress
events, and the layout sweep's results. Plain data; the ranking logic that
fills these lives in sweep/."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .aio_plan import AioPlan
from .offload import GainSplit
from .record import from_fields
from .aio_replay import ReplayRanking
from .steps import StepProgress
from .sweep import SweepPoint, Trial


@dataclass(frozen=True)
class Ranked:
    """One point's measurements over its repeats, by one executor."""

    point: SweepPoint
    executor: str
    scores: tuple[float, ...]          # one per successful repeat (bytes/s or 1/step_s)
    failed: int
    median: float
    spread: float                      # (max - min) / median over repeats, 0 for one repeat
    read_bytes_per_s: float
    write_bytes_per_s: float
    step_s: float | None = None
    optimizer_step_s: float | None = None

    @property
    def cost(self) -> tuple[int, int, int]:
        """Cheaper first: pinned staging memory, threads, queue depth."""
        p = self.point
        return (p.pinned_bytes(), p.intra_op_parallelism, p.queue_depth)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "point": self.point.to_json(), "key": self.point.key()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ranked:
        return from_fields(cls, {**data, "point": SweepPoint.from_json(data["point"]),
                                 "scores": tuple(data.get("scores", ()))})


NOTHING_TO_GAIN = "the defaults already saturate this drive; nothing to gain"
NOISY_FACTOR = 2.0       # records before the confirmation sequence: noisy was 2x the median rule's least spread
SLOWER_ON_STEPS = "no candidate beat DeepSpeed's defaults on real steps"
MORE_PAIRS_CAP = 1000    # the rule stops counting the pairs it needs here (iotune.sweep.sequential)


def more_pairs_phrase(more: int, seconds: float, least: bool = False) -> str:
    """"about 9 more pairs (≈ 14 min)": what an undecided comparison needs,
    the time from the measured trials ("" without a count; no time without
    times). `least`: a lower bound (no noise estimate yet)."""
    if more <= 0:
        return ""
    took = (f" (≈ {seconds:.0f} s)" if 0 < seconds < 120 else f" (≈ {seconds / 60:.0f} min)" if 0 < seconds < 7200
            else f" (≈ {seconds / 3600:.1f} h)" if seconds else "")
    if more >= MORE_PAIRS_CAP:
        return f"{MORE_PAIRS_CAP:,} or more further pairs at this spread"
    return f"{'at least' if least else 'about'} {more} more pair{'s' if more != 1 else ''}{took}"


@dataclass(frozen=True)
class StepGain:
    """The best candidate against DeepSpeed's defaults on real optimizer
    steps, from pairs run back to back in alternating order, as the
    confirmation rule (iotune.sweep.sequential) decided it. Each ratio is
    default / candidate optimizer-step time of one pair: above 1, the
    candidate is faster. verdict: "faster" (the interval's lower end clears
    1 + floor: recommended), "within noise" or "slower" (the defaults are
    recommended), "undecided" (the pairs could not settle it: the defaults
    are recommended, and `more_pairs` says what would). The interval
    [lower, upper] (0, 0: no interval before the rule's first look) is the
    rule's confidence sequence on the geometric mean `center`. Records from
    before it (center 0) decided on the median with a MAD bound."""

    candidate: SweepPoint
    ratios: tuple[float, ...]
    median: float
    min: float
    max: float
    pairs: int
    noise: float                         # the interval's half-width, a fraction of the center (upper / center - 1)
    verdict: str
    candidate_optimizer_step_s: float    # medians over the pairs
    default_optimizer_step_s: float
    split: GainSplit | None = None       # the gain by cause (less I/O, faster I/O), where the job's tensors are known
    lower: float = 0.0                   # the interval on the ratio (0, 0: none)
    upper: float = 0.0
    spread_measured: float = 0.0         # per-pair noise, sd of ln ratio, from the pairs
    spread_assumed: float = 0.0          # and the least the rule assumes
    floor: float = 0.0                   # the smallest gain worth reporting (fraction)
    max_pairs: int = 0                   # the most pairs the rule would have run
    center: float = 0.0                  # the geometric mean of the ratios (0: a record from before the sequence)
    more_pairs: int = 0                  # undecided: about this many more pairs would settle it
    more_s: float = 0.0                  # and their time at the pairs' measured trial times
    resolvable: float = 0.0              # the largest per-pair spread max_pairs pairs resolve at the floor
    alpha: float = 0.0                   # the sequence's error over every look, both sides

    @property
    def recommended(self) -> bool:
        return self.verdict == "faster"

    @property
    def estimate(self) -> float:
        """The ratio the rule decided on: the geometric mean (the median in older records)."""
        return self.center or self.median

    @property
    def noisy(self) -> bool:
        """The pairs spread more than max_pairs pairs resolve at the floor (a noise estimate needs 2 pairs)."""
        if not self.center:
            return self.spread_assumed > 0 and self.spread_measured > NOISY_FACTOR * self.spread_assumed
        return self.pairs >= 2 and max(self.spread_measured, self.spread_assumed) > self.resolvable

    def sentence(self) -> str:
        """What the steps showed, in the words the report prints."""
        x = self.estimate
        d = 1 if x >= 2 else 2       # 2.1× [2.0–2.2], 1.07× [1.06–1.08]
        mean = "geometric mean" if self.center else "median"
        pairs = f"{mean} of {self.pairs} pair{'s' if self.pairs != 1 else ''} [{self.min:.{d}f}–{self.max:.{d}f}]"
        caution = self._caution()
        if self.recommended:
            return f"optimizer step {x:.{d}f}× faster than DeepSpeed's defaults ({pairs}; {self._bound()})" + caution
        measured = (f"the best candidate's optimizer step ran at {x:.{d}f}× the defaults' speed, "
                    f"{pairs}: {self.verdict}; {self._bound()}")
        if self.verdict == "slower":
            return (f"{SLOWER_ON_STEPS} ({measured}){caution}; keeping DeepSpeed's defaults. A faster fio or aio "
                    f"score did not carry over to this job's steps")
        if self.verdict == "undecided":
            return f"undecided on real steps ({measured}){caution}; keeping DeepSpeed's defaults"
        return f"{NOTHING_TO_GAIN} ({measured}){caution}"

    def _bound(self) -> str:
        """The bound in words: what it shows against the floor."""
        if not self.center:
            return self._median_bound()
        worth = f"the {100 * self.floor:.0f}% worth reporting"
        if self.verdict == "undecided":
            if self.pairs < 2:
                return (f"no noise estimate from {self.pairs} pair{'s' if self.pairs != 1 else ''}; the rule needs "
                        f"{more_pairs_phrase(self.more_pairs, self.more_s, least=True)}")
            shown = (f"its interval {self.lower:.2f}–{self.upper:.2f}× neither clears nor excludes {worth}"
                     if self.upper else "no interval before the rule's first look")
            return (f"{shown} after {self.pairs} of at most {self.max_pairs} pairs; "
                    f"{more_pairs_phrase(self.more_pairs, self.more_s)} would settle it")
        if self.recommended:
            return f"at least {self.lower:.2f}× by the rule's interval, above {worth}"
        if self.verdict == "slower":
            return f"at most {self.upper:.2f}× by the rule's interval"
        return f"at most {self.upper:.2f}× by the rule's interval, under {worth}"

    def _median_bound(self) -> str:
        """A record from before the sequence: the median rule's bound."""
        if not self.upper:
            return f"noise ±{100 * self.noise:.0f}%"
        worth = f"the {100 * self.floor:.0f}% worth reporting"
        if self.recommended:
            return f"at least {self.lower:.2f}× within the noise bound, above {worth}"
        if self.verdict == "slower":
            return f"at most {self.upper:.2f}× within the noise bound"
        if self.upper < 1 + self.floor:
            return f"at most {self.upper:.2f}× within the noise bound, under {worth}"
        return (f"the noise bound {self.lower:.2f}–{self.upper:.2f}× does not clear {worth} after "
                f"{self.pairs} of at most {self.max_pairs} pairs")

    def rule_sentence(self) -> str:
        """How the confirmation rule decided, in words ("" for a record from before the rule)."""
        if not self.upper and not self.center:
            return ""
        spread = max(self.spread_measured, self.spread_assumed)
        source = ("as the pairs measured it" if self.spread_measured >= self.spread_assumed else
                  f"the least the rule assumes; the pairs measured ±{100 * self.spread_measured:.1f}%")
        if not self.center:
            return (f"decided on the median of the pairs' ratios: its bound {self.lower:.2f}–{self.upper:.2f}× "
                    f"allows for ±{100 * spread:.1f}% of noise per pair ({source}); a gain is reported once the "
                    f"bound's lower end clears {1 + self.floor:.2f}×; pairs are added until the rule decides, "
                    f"{self.max_pairs} at most")
        return (f"decided on the mean of the pairs' log ratios with a {100 * (1 - self.alpha):.0f}% confidence "
                f"sequence (Student's t, valid however many pairs are looked at) allowing for ±{100 * spread:.1f}% of "
                f"noise per pair ({source}); a gain is reported once its lower end clears {1 + self.floor:.2f}×; "
                f"pairs run back to back in alternating order, added until the rule decides, {self.max_pairs} at most")

    def _caution(self) -> str:
        if not self.noisy:
            return ""
        spread = max(self.spread_measured, self.spread_assumed)
        if not self.center:
            return (f"; the pairs spread ±{100 * self.spread_measured:.0f}%, above the "
                    f"±{100 * NOISY_FACTOR * self.spread_assumed:.0f}% the rule's stated error rate assumes")
        if not self.resolvable:
            return (f"; noisy: {self.max_pairs} pair{'s' if self.max_pairs != 1 else ''} cannot resolve the "
                    f"{100 * self.floor:.0f}% floor at any spread (the rule first decides at 3 pairs)")
        return (f"; noisy: the pairs spread ±{100 * spread:.1f}%, more than the ±{100 * self.resolvable:.1f}% "
                f"{self.max_pairs} pairs resolve at the {100 * self.floor:.0f}% floor, so gains near it stay undecided")

    def to_json(self) -> dict[str, Any]:
        split = {**asdict(self.split), "sentence": self.split.sentence()} if self.split else None
        return {**asdict(self), "candidate": self.candidate.to_json(), "sentence": self.sentence(), "split": split,
                "noisy": self.noisy}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepGain:
        split = data.get("split")
        return from_fields(cls, {**data, "candidate": SweepPoint.from_json(data["candidate"]),
                                 "ratios": tuple(data.get("ratios", ())),
                                 "split": from_fields(GainSplit, split) if isinstance(split, dict) else None})


@dataclass(frozen=True)
class SweepOutcome:
    """Everything a finished sweep reports."""

    target: str                                # the directory trials ran in
    profile: str
    executor: str                              # fio | aio
    ranking: list[Ranked]                      # the executor's ranking, best first
    confirmed: list[Ranked]                    # steps executor: candidates and the default
    recommended: SweepPoint | None
    default: Ranked | None                     # DeepSpeed's default aio settings, same executor
    ceiling_bytes_per_s: float | None          # the drive's limit (known, or measured)
    ceiling_source: str                        # "known limits" | "measured: ..."
    fragment: dict[str, object]                # DeepSpeed JSON to paste
    validation_error: str | None               # None: DeepSpeed accepted it
    trials: int
    trials_run_now: int
    failed: int
    journal: str
    step_gain: StepGain | None = None          # the steps' verdict on the best candidate vs the defaults
    applied_to: str = ""                       # --apply: the config written
    dropped_aio_keys: tuple[str, ...] = ()     # older --apply: the user's aio keys it left out (now kept as written)
    confirm_error: str = ""                    # every training-step trial failed: the first reason
    threads: list[Ranked] = field(default_factory=list)   # the recommendation at each OMP_NUM_THREADS
    omp_threads_best: int = 0                  # the thread count to use (0: not measured)
    replay: ReplayRanking | None = None        # the finalists on the replay of the job's swap I/O (None: no replay)
    plan: AioPlan | None = None                # fitted to --budget once the first training-step trial was timed
    stopped: str = ""                          # "budget": the budget stopped something planned
    undecided: tuple[str, ...] = ()            # what the budget left undecided, with what deciding it would take

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepOutcome:
        """An outcome from `iotune sweep --json` (render/sweep.py's document)."""
        def ranked(key: str) -> list[Ranked]:
            return [Ranked.from_json(r) for r in data.get(key) or ()]

        return from_fields(cls, {**data, "ranking": ranked("ranking"), "confirmed": ranked("confirmed"),
                                 "threads": ranked("threads"),
                                 "default": Ranked.from_json(data["default"]) if data.get("default") else None,
                                 "recommended": SweepPoint.from_json(data["recommended"]) if data.get("recommended")
                                 else None,
                                 "step_gain": StepGain.from_json(data["step_gain"]) if data.get("step_gain") else None,
                                 "replay": ReplayRanking.from_json(data["replay"]) if data.get("replay") else None,
                                 "plan": AioPlan.from_json(data["plan"]) if data.get("plan") else None,
                                 "undecided": tuple(data.get("undecided") or ()),
                                 "dropped_aio_keys": tuple(data.get("dropped_aio_keys", ()))})

    def tied_with_first(self) -> list[Ranked]:
        """The ranked points (after the first) the executor cannot tell apart
        from the first: within the noise (MIN_NOISE or their spread)."""
        if not self.ranking:
            return []
        return [r for r in self.ranking[1:] if tie(self.ranking[0], r)]

    def recommended_row(self) -> Ranked | None:
        """The recommendation's row in the executor's ranking."""
        if self.recommended is None:
            return None
        key = self.recommended.key()
        return next((r for r in self.ranking if r.point.key() == key), None)


# Two configs within 5% are never told apart: run-to-run variation of storage
# measurements (throttle bursts, writeback, device housekeeping) is of that order.
MIN_NOISE = 0.05


def tie(a: Ranked, b: Ranked, noise: float = MIN_NOISE) -> bool:
    """True when a and b differ by less than the noise of either."""
    if a.median <= 0 or b.median <= 0:
        return False
    band = max(noise, a.spread, b.spread)
    return abs(a.median - b.median) <= band * max(a.median, b.median)


def gain(best: Ranked | None, default: Ranked | None) -> float | None:
    """best / default on the executor's score (bandwidth or 1/step time)."""
    if best is None or default is None or default.median <= 0:
        return None
    return best.median / default.median


@dataclass(frozen=True)
class Running:
    """The trial being run now, and how far its training job is (None: not
    a training trial, or no step reported yet)."""

    executor: str
    point: SweepPoint
    repeat: int
    steps: StepProgress | None = None


@dataclass(frozen=True)
class Progress:
    """For progress displays: one trial done (or taken from the journal),
    or, with `trial` None, one started or one of its steps finished
    (`running` says which)."""

    done: int
    planned: int
    trial: Trial | None
    reused: bool = False          # taken from the journal, not run now
    running: Running | None = None


@dataclass(frozen=True)
class LayoutResult:
    name: str
    drives: int
    backend: str
    reason: str
    outcome: SweepOutcome
    fstype: str = ""                           # the filesystem the trials ran on ("": not recorded)
    mount_options: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayoutResult:
        """One layout of `iotune sweep layouts --json`."""
        return cls(str(data["layout"]), int(data["drives"]), str(data["backend"]), str(data.get("reason", "")),
                   SweepOutcome.from_json(data["outcome"]), str(data.get("fstype", "")),
                   tuple(data.get("mount_options", ())))

    def best(self) -> float:
        """The best point's score (0 when nothing was measured)."""
        r = self.outcome.ranking
        return r[0].median if r and r[0].scores else 0.0


@dataclass(frozen=True)
class Effects:
    layout: float      # best score of the best layout / best score of the worst layout
    aio: float         # largest best/worst ratio of aio settings within one layout
    filesystem: float = 1.0    # largest best/worst ratio of (filesystem, mount options) at one drive count
    drives: float = 1.0        # largest best/worst ratio of drive counts for one (filesystem, options)

    @property
    def dominant(self) -> str:
        """The dimension with the largest effect: "layout" (the drive count,
        or the whole layout when only one filesystem was tried), "filesystem"
        or "aio settings"; ties go to the first."""
        effects = {"layout": self.layout if self.filesystem <= 1.0 else self.drives,
                   "filesystem": self.filesystem, "aio settings": self.aio}
        return max(effects, key=lambda k: effects[k])


@dataclass(frozen=True)
class LayoutSweep:
    """`iotune sweep layouts --drives N`: every layout's sweep, and what mattered."""

    results: tuple[LayoutResult, ...]
    effects: Effects

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayoutSweep:
        """`iotune sweep layouts --json` (render/sweep.py's document)."""
        return cls(tuple(LayoutResult.from_json(r) for r in data["layouts"]),
                   Effects(float(data["layout_effect"]), float(data["aio_effect"]),
                           float(data.get("filesystem_effect", 1.0)), float(data.get("drive_count_effect", 1.0))))

    def ranking(self) -> list[str]:
        """Layout names, best first by their best point's score (same scale for all)."""
        return [r.name for r in sorted(self.results, key=lambda r: -r.best())]
