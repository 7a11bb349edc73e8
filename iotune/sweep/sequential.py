"""The confirmation rule: is a candidate faster than a reference (DeepSpeed's
defaults, or the job's own config) on real training steps? Decided from
pairs of trials, one pair at a time, with an error rate that holds however
many pairs are looked at. Pure computation.

The data. Pair k gives x_k = ln(reference's time / candidate's time) (above
0: the candidate is faster); the two trials of a pair run back to back, the
candidate first when k is even and the reference first when k is odd
(`candidate_first`): consecutive pairs make ABBA blocks, so a slow drift of
a shared machine, or a warm-cache advantage of whichever runs first, cancels
from the mean instead of biasing it (the candidate-first A/A mean was
-0.13 %).

The interval. After n pairs, with mean m and sample standard deviation s of
the x_k (n - 1 degrees of freedom):

    spread  = max(s, min_spread)                   (never less than 1 % per pair)
    alpha_n = alpha * f / (n (n + 1))              for n >= f, the first look (3)
    h_n     = t_{n-1}(1 - alpha_n / 2) * spread / sqrt(n)
    [lower, upper] = [exp(m - h_n), exp(m + h_n)]  on the ratio

t_{n-1} is Student's t quantile, the small-sample correction for a spread
estimated from n pairs. With a spread known from elsewhere (`known_spread`,
e.g. A/A runs of the reference that day) it is the normal quantile, with
spread = max(known, s, min_spread), from the first pair on (f = 1).

Verdicts, with L = ln(1 + noise_floor), the smallest gain worth reporting:
  - "faster" when m - h_n > L: the whole interval is above 1 + noise_floor;
  - "slower" when m + h_n < 0 and m < -L;
  - "within noise" when m + h_n < L: the interval excludes every gain worth reporting;
  - otherwise "undecided", also at max_pairs: then `more_pairs_needed` says
    about how many more pairs would settle it, were the mean and spread to
    stay as measured. Never "faster" from fewer than f pairs (one pair has no
    spread to measure; the rule first looks at 3).

The guarantee. If the x_k are independent and normal with any mean mu and
any standard deviation, the intervals cover mu at every n at once with
probability at least 1 - alpha (alpha = 0.05): the sum of alpha_n over
n >= f is alpha (a union bound over every look; each t interval is exact
under normal noise, and widening it to min_spread keeps it so). It is a
confidence sequence: it stays valid whatever decides when to stop: the rule
itself, a user who stops early, or one who runs more pairs after
"undecided" (a resumed sweep with a larger --max-pairs). Hence, each side
alone at most alpha / 2 = 2.5 %, over the whole sequence of looks:
  - P(the rule ever says "faster") <= 2.5 % when the true gain is at most
    1 + noise_floor (an A/A comparison: far less, see below);
  - P(it ever says "within noise" or "slower") <= 2.5 % when the true gain is
    at least 1 + noise_floor.
With a known spread it holds when that spread is at least the true one.
What it costs: a comparison the pairs cannot settle stays "undecided", and
the report says how many more pairs it would take.

`noisy`: the spread exceeds `resolvable`, the largest per-pair spread at
which max_pairs pairs give an interval no wider than +-L (h_N = L): beyond
it the rule cannot tell, within max_pairs, a gain at the floor from none,
nor twice the floor from the floor. Below the first look (max_pairs 1 or 2
without a known spread) nothing is resolvable, so two pairs are "noisy";
one pair has no spread at all: "undecided: no noise estimate", never noisy.

Measured by simulation (`simulate`, seeded; benchmarks/sequential_rule.py
writes this table) for the default rule (floor 5 %, at most 6 pairs, alpha
0.05, min_spread 1 %). Each cell: the count over the decisions the
project's targets name (150 A/A and at the floor, 50 at each gain; seed 1),
then the rate over 2,000 (seed 2); "noisy" is the share of A/A decisions
flagged; "pairs" the mean pairs per decision at 1.0x, 1.10x and 1.15x:

  noise per pair             A/A faster    1.05x faster  1.10x found    1.15x found    noisy   pairs
  normal 0.5 %               0/150 0%      0/150 0%      50/50 100%     50/50 100%     0%      3.8 4.0 3.0
  normal 2 %                 0/150 0%      0/150 0%      32/50 72%      50/50 100%     20%     4.9 5.0 3.6
  normal 5 %                 0/150 0%      0/150 0.4%    4/50 13%       25/50 50%      89%     5.8 5.8 5.3
  normal 10 %                0/150 0.1%    0/150 0.4%    1/50 4.2%      4/50 14%       98%     5.9 5.9 5.8
  normal 15 %                0/150 0.2%    0/150 0.6%    1/50 1.9%      1/50 6.0%      99%     5.9 6.0 5.9
  2 %, 1 pair in 10 at 10 %  0/150 0%      0/150 0%      21/50 54%      41/50 88%      41%     5.1 5.2 4.0
  5 %, 1 pair in 10 at 25 %  0/150 0%      1/150 0.2%    2/50 11%       16/50 37%      92%     5.8 5.8 5.4
  0.5 %, first runner +-1 %  0/150 0%      0/150 0%      50/50 100%     50/50 100%     0%      4.2 4.2 3.0

Against the targets, within the default 6 pairs:
  - A/A "faster" at most 1 of 150: met at every noise level (rate <= 0.2 %);
  - "faster" at the floor (1.05x) at most 5 %: met everywhere (<= 0.6 %);
  - 1.10x found in 45 of 50: met at 0.5 % per pair only (72 % at 2 %,
    13 % at 5 %, 4 % or less at 10-15 %);
  - 1.15x found in 48 of 50: met at 0.5 % and 2 % (50 % at 5 %, 14 % at
    10 %, 6 % at 15 %; 88 % at 2 % with one pair in ten disturbed);
  - `noisy` in 90 % under induced noise: met at 10 % and 15 % (98-99 %) and
    at 5 % with outliers (92 %); 89 % at 5 %; it also fires in 20 % of
    decisions at 2 %, just under the 2.3 % per pair that 6 pairs resolve.
Where a target is missed the rule does not guess: those decisions end
"undecided", with the pairs they would need. With no cap on pairs (200
decisions each), the median pairs to find 1.10x are 5, 17, 72 and 190 at
2, 5, 10 and 15 % per pair (1.15x: 3, 7, 18, 39): at a 1B job's 10-15 %,
hours of pairs. These are simulated, not real steps; measuring them on real
steps at that scale takes hours per decision and is not done here.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import IotuneError
from ..model.sweep_result import MORE_PAIRS_CAP        # more_pairs_needed stops counting here ("1,000 or more")

VERDICTS = ("faster", "slower", "within noise", "undecided")
# The most pairs of a comparison on replays of a job's swap I/O (the aio
# sweep's replay_pairs default, the offload search's cap). Twice the real
# steps' 6: a replay has no compute and takes seconds where a 1B step takes
# minutes, so pairs are cheap, and at the 2 % per pair measured on replays
# 6 pairs find 1.10x 72 % of the time (simulated; 30 of 50 measured at
# 2.1 %), 12 pairs 99.9 % (simulated; 50 of 50 measured at 1.4 %). A
# comparison that decides early stops early; a gain at the floor runs all
# 12 and ends undecided.
REPLAY_MAX_PAIRS = 12
PAIR_ORDERS = ("candidate-first", "reference-first")
_NORMAL = statistics.NormalDist()


def candidate_first(pair: int) -> bool:
    """Pair k (from 0) runs the candidate first when k is even (ABBA blocks)."""
    return pair % 2 == 0


def pair_order(pair: int) -> str:
    """The order of pair k, as trials record it."""
    return PAIR_ORDERS[0] if candidate_first(pair) else PAIR_ORDERS[1]


@dataclass(frozen=True)
class SequentialRule:
    """The rule's settings. noise_floor: the smallest gain worth reporting (a
    fraction); max_pairs: the most pairs a caller runs; alpha: the error of
    the confidence sequence over every look, both sides together;
    min_spread: the least per-pair noise (sd of ln ratio) it assumes;
    min_pairs: the first look without a known spread (at least 2)."""

    noise_floor: float = 0.05
    max_pairs: int = 6
    alpha: float = 0.05
    min_spread: float = 0.01
    min_pairs: int = 3

    def __post_init__(self) -> None:
        if self.max_pairs < 1 or self.min_pairs < 2:
            raise IotuneError(f"the confirmation rule needs at least 1 pair and a first look at 2 pairs or more "
                              f"(max_pairs {self.max_pairs}, min_pairs {self.min_pairs}); set confirm_pairs to 1 "
                              f"or more")
        if not (0 <= self.noise_floor < 1 and 0 < self.alpha < 1 and self.min_spread > 0):
            raise IotuneError(f"the confirmation rule needs 0 <= noise_floor < 1, 0 < alpha < 1 and min_spread > 0 "
                              f"(got {self.noise_floor}, {self.alpha}, {self.min_spread})")

    @property
    def first_look(self) -> int:
        """The first pair count at which the rule may decide, without a known spread."""
        return self.min_pairs

    def look(self, known: bool) -> int:
        """The first look: pair 1 with a known spread, else min_pairs."""
        return 1 if known else self.min_pairs

    def width(self, n: int, known: bool = False) -> float:
        """h_n / spread: the half-width of the interval after n pairs per unit
        of per-pair spread (inf before the first look)."""
        first = self.look(known)
        if n < first:
            return math.inf
        tail = self.alpha * first / (n * (n + 1)) / 2
        q = _NORMAL.inv_cdf(1 - tail) if known else t_quantile(1 - tail, n - 1)
        return q / math.sqrt(n)

    def resolvable(self, known: bool = False) -> float:
        """The largest per-pair spread at which max_pairs pairs give an
        interval of +-ln(1 + noise_floor) (0: none, below the first look)."""
        return math.log1p(self.noise_floor) / self.width(self.max_pairs, known)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p in (0.5, 1) and whole df >= 1: exact (its
    distribution function, Abramowitz and Stegun 26.7.3-4, inverted by
    bisection) up to 200 degrees of freedom, then the Cornish-Fisher series."""
    if df > 200:
        z = _NORMAL.inv_cdf(p)
        return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    target = 2 * p - 1                   # P(|T| <= t)
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < target:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with whole df (a finite series in cos(theta))."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for k in range(2, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return s * total


@dataclass(frozen=True)
class PairDecision:
    """What the rule decided from `pairs` ratios. In ratios, not logs: the
    geometric mean and the interval (0, inf before the first look). The
    per-pair noise (sd of ln ratio): `measured` from the pairs (0 below 2),
    `assumed` the rule's min_spread, `known` given from elsewhere (0: none);
    the interval used the largest."""

    verdict: str                 # faster | slower | within noise | undecided
    pairs: int
    center: float
    lower: float
    upper: float
    measured: float
    assumed: float
    floor: float                 # the rule's noise_floor
    max_pairs: int
    alpha: float
    known: float = 0.0
    more_pairs_needed: int = 0   # undecided: about this many more pairs would settle it (MORE_PAIRS_CAP: or more)
    resolvable: float = 0.0      # the largest spread max_pairs pairs resolve at the floor

    @property
    def decided(self) -> bool:
        return self.verdict != "undecided"

    @property
    def estimated(self) -> bool:
        """A noise estimate exists: 2 pairs or more, or a known spread."""
        return self.pairs >= 2 or self.known > 0

    @property
    def spread(self) -> float:
        """The per-pair noise the interval used."""
        return max(self.measured, self.assumed, self.known)

    @property
    def noisy(self) -> bool:
        """The spread is more than max_pairs pairs resolve at the floor."""
        return self.estimated and self.spread > self.resolvable

    @property
    def equal(self) -> bool:
        """Neither side is faster by the floor: the interval lies within
        1 / (1 + floor) .. 1 + floor (equal within the rule's resolution)."""
        return self.decided and self.lower * (1 + self.floor) > 1 and self.upper < 1 + self.floor


def interval(x: Sequence[float], rule: SequentialRule, known: float = 0.0) -> tuple[float, float, float]:
    """(mean, half-width, measured sd) of log ratios `x` (half-width inf before the first look)."""
    n = len(x)
    m = math.fsum(x) / n if n else 0.0
    s = math.sqrt(math.fsum((v - m) ** 2 for v in x) / (n - 1)) if n > 1 else 0.0
    return m, rule.width(n, known > 0) * max(s, rule.min_spread, known), s


def verdict(m: float, h: float, floor: float) -> str:
    """On logs: mean m, half-width h, L = ln(1 + noise_floor)."""
    if m - h > floor:
        return "faster"
    if m + h < 0 and m < -floor:
        return "slower"
    if m + h < floor:
        return "within noise"
    return "undecided"


def decide(ratios: Sequence[float], rule: SequentialRule = SequentialRule(), known_spread: float = 0.0) -> PairDecision:
    """The verdict on the pairs so far (each ratio: reference's time /
    candidate's time); "undecided" asks for another pair, or, past
    max_pairs, says how many more would settle it."""
    if any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise IotuneError(f"a pair's ratio must be a positive number (got {list(ratios)}): "
                          f"each is the reference's time / the candidate's time")
    if not (0 <= known_spread < math.inf):
        raise IotuneError(f"a known per-pair spread must be a number >= 0 (got {known_spread})")
    x = [math.log(r) for r in ratios]
    m, h, s = interval(x, rule, known_spread)
    floor = math.log1p(rule.noise_floor)
    said = verdict(m, h, floor)
    more = 0 if said != "undecided" else more_pairs(x, rule, known_spread)
    lower, upper = (math.exp(m - h), math.exp(m + h)) if math.isfinite(h) else (0.0, math.inf)
    return PairDecision(said, len(x), math.exp(m), lower, upper, s, rule.min_spread, rule.noise_floor,
                        rule.max_pairs, rule.alpha, known_spread, more, rule.resolvable(known_spread > 0))


def decide_by_looks(ratios: Sequence[float], rule: SequentialRule) -> PairDecision:
    """The verdict `ratios` reach looked at as the replay pairs are run
    (iotune.sweep.replay_pairs): after rule.first_look pairs, then that many
    more at a time, until it decides or max_pairs (later ratios unused)."""
    n = 0
    d = decide([], rule)
    while n < rule.max_pairs and not d.decided:
        n = min(n + rule.first_look, rule.max_pairs)
        d = decide(ratios[:n], rule)
    return d


def more_pairs(x: Sequence[float], rule: SequentialRule, known: float = 0.0) -> int:
    """About how many more pairs the interval needs to clear or exclude the
    floor, were the mean and spread to stay as measured: the first N with
    h_N < |m - L|. Without a noise estimate (fewer than 2 pairs, no known
    spread): the pairs to the first look. MORE_PAIRS_CAP: that many or more
    (no N up to MORE_PAIRS_CAP would do)."""
    n = len(x)
    if n < 2 and not known:
        return max(rule.look(False) - n, 1)
    m, _, s = interval(x, rule, known)
    gap, spread = abs(m - math.log1p(rule.noise_floor)), max(s, rule.min_spread, known)
    lo, hi = n + 1, MORE_PAIRS_CAP
    if rule.width(hi, known > 0) * spread >= gap:
        return MORE_PAIRS_CAP
    while lo < hi:                                   # the width falls with n: bisect for the first N
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if rule.width(mid, known > 0) * spread >= gap else (lo, mid)
    return lo - n


@dataclass(frozen=True)
class Simulated:
    """`decisions` simulated comparisons: how many ended in each verdict
    (at max_pairs: undecided), how many were flagged noisy, and the pairs
    each took."""

    decisions: int
    faster: int
    slower: int
    within_noise: int
    undecided: int
    noisy: int
    pairs: tuple[int, ...]

    @property
    def faster_rate(self) -> float:
        return self.faster / self.decisions

    @property
    def mean_pairs(self) -> float:
        return sum(self.pairs) / len(self.pairs)


def simulate(rule: SequentialRule, gain: float = 1.0, core: float = 0.01, outliers: float = 0.0,
             outlier_spread: float = 0.1, decisions: int = 1000, seed: int = 1, order_bias: float = 0.0,
             known_spread: float = 0.0) -> Simulated:
    """Run the rule on `decisions` seeded comparisons of a true ratio `gain`
    (1.0: A/A): ln r of pair k is ln(gain) plus normal noise of sd `core`,
    or, for a fraction `outliers` of the pairs, of sd `outlier_spread`; plus
    `order_bias` when the candidate runs first and minus it otherwise. Pairs
    are drawn one at a time until the rule decides or max_pairs is reached,
    as a sweep runs them."""
    rng = random.Random(seed)
    counts = dict.fromkeys(VERDICTS, 0)
    used: list[int] = []
    noisy = 0
    for _ in range(decisions):
        x: list[float] = []
        said = "undecided"
        while said == "undecided" and len(x) < rule.max_pairs:
            sd = outlier_spread if rng.random() < outliers else core
            bias = order_bias if candidate_first(len(x)) else -order_bias
            x.append(math.log(gain) + bias + rng.gauss(0.0, sd))
            m, h, _ = interval(x, rule, known_spread)
            said = verdict(m, h, math.log1p(rule.noise_floor))
        counts[said] += 1
        used.append(len(x))
        noisy += decide([math.exp(v) for v in x], rule, known_spread).noisy
    return Simulated(decisions, counts["faster"], counts["slower"], counts["within noise"], counts["undecided"],
                     noisy, tuple(used))
