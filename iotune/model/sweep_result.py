"""What a sweep produces: ranked points, the outcome of one sweep, progress
events, and the layout sweep's results. Plain data; the ranking logic that
fills these lives in sweep/."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .offload import GainSplit
from .record import from_fields
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
NOISY_FACTOR = 2.0       # the confirmation rule's error rate is stated for pairs spread up to this x its minimum
SLOWER_ON_STEPS = "no candidate beat DeepSpeed's defaults on real steps"


@dataclass(frozen=True)
class StepGain:
    """The best candidate against DeepSpeed's defaults on real optimizer
    steps, from alternating pairs (candidate, then the defaults), as the
    confirmation rule (iotune.sweep.sequential) decided it. Each ratio is
    default / candidate optimizer-step time of one pair: above 1, the
    candidate is faster. verdict: "faster" (the bound's lower end clears
    1 + floor: recommended), "within noise" or "slower" (the defaults are
    recommended). The bound [lower, upper] is the median's, widened by the
    per-pair noise: measured from the pairs (1.4826 x MAD of ln ratio), or
    the rule's assumed minimum when the pairs show less."""

    candidate: SweepPoint
    ratios: tuple[float, ...]
    median: float
    min: float
    max: float
    pairs: int
    noise: float                         # the bound's half-width, a fraction of the median (upper / median - 1)
    verdict: str
    candidate_optimizer_step_s: float    # medians over the pairs
    default_optimizer_step_s: float
    split: GainSplit | None = None       # the gain by cause (less I/O, faster I/O), where the job's tensors are known
    lower: float = 0.0                   # the bound on the median ratio (0, 0: recorded before the rule had one)
    upper: float = 0.0
    spread_measured: float = 0.0         # per-pair noise, sd of ln ratio: from the pairs (1.4826 x MAD)
    spread_assumed: float = 0.0          # and the least the rule assumes
    floor: float = 0.0                   # the smallest gain worth reporting (fraction)
    max_pairs: int = 0                   # the most pairs the rule would have run

    @property
    def recommended(self) -> bool:
        return self.verdict == "faster"

    @property
    def noisy(self) -> bool:
        """The pairs spread more than the rule's stated error rate assumes (2x its minimum)."""
        return self.spread_assumed > 0 and self.spread_measured > NOISY_FACTOR * self.spread_assumed

    def sentence(self) -> str:
        """What the steps showed, in the words the report prints."""
        d = 1 if self.median >= 2 else 2       # 2.1× [2.0–2.2], 1.07× [1.06–1.08]
        pairs = f"median of {self.pairs} pair{'s' if self.pairs != 1 else ''} [{self.min:.{d}f}–{self.max:.{d}f}]"
        caution = self._caution()
        if self.recommended:
            return f"optimizer step {self.median:.{d}f}× faster than DeepSpeed's defaults ({pairs}; {self._bound()})" \
                + caution
        measured = (f"the best candidate's optimizer step ran at {self.median:.{d}f}× the defaults' speed, "
                    f"{pairs}: {self.verdict}; {self._bound()}")
        if self.verdict == "slower":
            return (f"{SLOWER_ON_STEPS} ({measured}){caution}; keeping DeepSpeed's defaults. A faster fio or aio "
                    f"score did not carry over to this job's steps")
        return f"{NOTHING_TO_GAIN} ({measured}){caution}"

    def _bound(self) -> str:
        """The bound in words: what it shows against the floor."""
        if not self.upper:                           # recorded before the bound existed
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
        if not self.upper:
            return ""
        spread = max(self.spread_measured, self.spread_assumed)
        source = ("as the pairs measured it" if self.spread_measured >= self.spread_assumed else
                  f"the least the rule assumes; the pairs measured ±{100 * self.spread_measured:.1f}%")
        return (f"decided on the median of the pairs' ratios: its bound {self.lower:.2f}–{self.upper:.2f}× allows "
                f"for ±{100 * spread:.1f}% of noise per pair ({source}); a gain is reported once the bound's lower "
                f"end clears {1 + self.floor:.2f}×; pairs are added until the rule decides, {self.max_pairs} at most")

    def _caution(self) -> str:
        if not self.noisy:
            return ""
        return (f"; the pairs spread ±{100 * self.spread_measured:.0f}%, above the "
                f"±{100 * NOISY_FACTOR * self.spread_assumed:.0f}% the rule's stated error rate assumes")

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
