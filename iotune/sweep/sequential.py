"""The confirmation rule: is a candidate faster than DeepSpeed's defaults on
real training steps? Decided from alternating pairs (candidate, then the
defaults), one pair at a time, with a stated error rate. Pure computation.

The data. Each pair gives a ratio r = defaults' time / candidate's time
(above 1: the candidate is faster), taken back to back so that slow drift of
a shared machine cancels. The rule works on x = ln r, so a candidate and the
defaults swapped give -x: under an A/A comparison (the same settings on both
sides) x is symmetric around 0.

The statistic: the median of x, with a bound of `z` robust standard errors,
  spread = max(min_spread, 1.4826 * MAD(x)),   half-width h = z * spread / sqrt(n),
  lower, upper = exp(median - h), exp(median + h)
where MAD is the median absolute deviation from the median (1.4826 * MAD
estimates the standard deviation of normal noise). After each pair from
`min_pairs` on:
  - "faster" when lower > 1 + noise_floor: the gain is at least the smallest
    gain worth reporting, beyond the bound;
  - "slower" when upper < 1 and the median is below 1 - noise_floor;
  - "within noise" when upper < 1 + noise_floor: no gain worth reporting;
  - otherwise "undecided": run another pair. At `max_pairs` (or when no
    further pair can come) an undecided comparison is "within noise".

Why the median and a MAD bound, not a sign test or the range. One disturbed
trial (another job's burst of I/O, a page-cache flush) moves one ratio by
10 % or more; the median ignores it, where a range rule (noise =
max(floor, max - min)) lets one pair at 0.99 veto pairs at 1.17 and 1.20. A sign test is exact under any symmetric noise, but three of three
pairs above 1 happen in 1/8 of A/A comparisons, so an error rate under 1 %
takes 7 pairs, all of them faster, where this rule needs 3 and forgives
one. With 3 to 5 pairs the MAD can come out near 0 by chance (two equal
ratios), so the bound never assumes less than `min_spread` per pair; the MAD
widens it on a noisier machine. The rule's error rate therefore holds under
a stated noise model, computed by simulation (`simulate`, seeded), looks
after every pair included:

Noise model, calibrated on a 2-core VM: the optimizer step of the built-in
`tiny` workload on the `bandwidth-only` test bed, repeated with identical
settings (StepsExecutor, warm starts, 4-6 steps per trial), on a machine
busy with other work. Between the two trials of a pair, ln r had a
MAD-based standard deviation of 0.3-0.5 % at a 40 MB/s cap (optimizer step
2.2 s; 74 A/A pairs, benchmarks/confirm_rule.py), and trials at the bed's
own 200 MB/s (optimizer step 0.44 s) varied by 0.9 % (sd of 10), about
1.3 % per pair; 2 of the 74 pairs were disturbed by about 10 % (+10.0 %,
-10.2 %). Modelled, with margin: normal noise of sd `core`, and a
fraction of pairs (10 % or 20 %) drawn instead with sd 10 % or 20 %.

Error rates of the default rule (noise_floor 0.05, 3 to 6 pairs, z 3,
min_spread 2 %), 200,000 simulated decisions each (seed 1; mean pairs used):

  noise (sd of ln r)              A/A "faster"  1.15x "faster"  pairs A/A  pairs 1.15x
  core 0.5 %, no outliers            0             100 %           3.0        3.0
  core 1 %, 10 % of pairs @ 10 %     0.05 %        99.95 %         3.1        3.0
  core 2 %, 10 % of pairs @ 10 %     0.05 %        99.9 %          3.5        3.1
  core 2 %, 20 % of pairs @ 20 %     0.4 %         97.9 %          3.8        3.2
  core 4 %, no outliers              0.07 %        98.7 %          4.2        3.3
  core 8 %, no outliers              3.3 %         77 %            4.8        4.1

So on noise up to twice `min_spread` an A/A comparison is reported faster in
about 1 in 2,000 decisions (20 A/A decisions all pass with probability 0.99),
and a 1.15x gain is found in 98-100 %, almost always after the minimum of 3
pairs. The rate grows beyond that noise (`PairDecision.noisy` says when the
pairs' own spread is past it). A gain near the floor (1.03-1.07x) takes up to
`max_pairs` to settle. noise_floor 0 removes the margin: A/A then runs to
`max_pairs` and is reported faster in 1.6 % of decisions at a core of 2 %
(10 % of pairs @ 10 %), 11 % at 4 %.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import IotuneError
from ..model.sweep_result import NOISY_FACTOR       # the stated error rates hold up to this many times min_spread

MAD_TO_SD = 1.4826          # 1 / Phi^-1(3/4): the MAD of normal noise times this is its standard deviation
VERDICTS = ("faster", "slower", "within noise", "undecided")


@dataclass(frozen=True)
class SequentialRule:
    """The rule's settings. noise_floor: the smallest gain worth reporting
    (a fraction); pairs are added one at a time from min_pairs to max_pairs;
    z: the bound's width in robust standard errors of the median; min_spread:
    the per-pair noise (sd of ln ratio) the bound assumes at least."""

    noise_floor: float = 0.05
    min_pairs: int = 3
    max_pairs: int = 6
    z: float = 3.0
    min_spread: float = 0.02

    def __post_init__(self) -> None:
        if self.min_pairs < 1 or self.max_pairs < 1:
            raise IotuneError(f"the confirmation rule needs at least 1 pair (min_pairs {self.min_pairs}, "
                              f"max_pairs {self.max_pairs}); set confirm_pairs to 1 or more")
        if not (0 <= self.noise_floor < 1 and self.z > 0 and self.min_spread > 0):
            raise IotuneError(f"the confirmation rule needs 0 <= noise_floor < 1, z > 0 and min_spread > 0 "
                              f"(got {self.noise_floor}, {self.z}, {self.min_spread})")

    @property
    def first_look(self) -> int:
        """The first pair count at which the rule may decide (min_pairs, at most max_pairs)."""
        return min(self.min_pairs, self.max_pairs)


@dataclass(frozen=True)
class PairDecision:
    """What the rule decided from `pairs` ratios. In ratios, not logs: the
    median and the ends of the bound. The per-pair noise (sd of ln ratio, a
    fraction): `measured` from the pairs themselves (1.4826 x MAD; 0 below 2
    pairs), `assumed` the rule's min_spread; the bound used the larger.
    Without a pair the bound is (0, inf)."""

    verdict: str                 # faster | slower | within noise | undecided (run another pair)
    pairs: int
    median: float
    lower: float
    upper: float
    measured: float
    assumed: float
    floor: float                 # the rule's noise_floor
    max_pairs: int

    @property
    def decided(self) -> bool:
        return self.verdict != "undecided"

    @property
    def spread(self) -> float:
        """The per-pair noise the bound used."""
        return max(self.measured, self.assumed)

    @property
    def noisy(self) -> bool:
        """The pairs spread more than the stated error rates assume."""
        return self.measured > NOISY_FACTOR * self.assumed


def decide(ratios: Sequence[float], rule: SequentialRule = SequentialRule(), final: bool = False) -> PairDecision:
    """The verdict on the pairs so far: "undecided" asks for another pair.
    Never "undecided" at rule.max_pairs, nor with `final` (no further pair
    can come, e.g. pairs that failed used up the maximum)."""
    if any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise IotuneError(f"a pair's ratio must be a positive number (got {list(ratios)}): "
                          f"each is defaults' time / candidate's time")
    n = len(ratios)
    last = final or n >= rule.max_pairs
    if n == 0:
        return PairDecision("within noise" if last else "undecided", 0, 1.0, 0.0, math.inf, 0.0, rule.min_spread,
                            rule.noise_floor, rule.max_pairs)
    verdict, m, h, measured = _judge([math.log(r) for r in ratios], rule, last)
    return PairDecision(verdict, n, math.exp(m), math.exp(m - h), math.exp(m + h), measured, rule.min_spread,
                        rule.noise_floor, rule.max_pairs)


def _judge(x: list[float], rule: SequentialRule, last: bool) -> tuple[str, float, float, float]:
    """(verdict, median, half-width, measured spread) of log ratios `x` (at least one)."""
    n = len(x)
    m = statistics.median(x)
    measured = MAD_TO_SD * statistics.median([abs(v - m) for v in x]) if n > 1 else 0.0
    h = rule.z * max(rule.min_spread, measured) / math.sqrt(n)
    verdict = _verdict(m, h, math.log1p(rule.noise_floor)) if n >= rule.first_look else "undecided"
    return ("within noise" if verdict == "undecided" and last else verdict), m, h, measured


def _verdict(m: float, h: float, floor: float) -> str:
    """On logs: median m, half-width h, the floor ln(1 + noise_floor)."""
    if m - h > floor:
        return "faster"
    if m + h < 0 and m < -floor:
        return "slower"
    if m + h < floor:
        return "within noise"
    return "undecided"


@dataclass(frozen=True)
class Simulated:
    """`decisions` simulated comparisons: how many ended in each verdict,
    and the pairs each took."""

    decisions: int
    faster: int
    slower: int
    within_noise: int
    pairs: tuple[int, ...]

    @property
    def faster_rate(self) -> float:
        return self.faster / self.decisions

    @property
    def mean_pairs(self) -> float:
        return sum(self.pairs) / len(self.pairs)


def simulate(rule: SequentialRule, gain: float = 1.0, core: float = 0.01, outliers: float = 0.1,
             outlier_spread: float = 0.1, decisions: int = 10_000, seed: int = 1) -> Simulated:
    """Run the rule on `decisions` seeded comparisons of a true ratio `gain`
    (1.0: A/A) under the noise model of the module docstring: ln r is
    ln(gain) plus normal noise of sd `core`, or, for a fraction `outliers` of
    the pairs, of sd `outlier_spread`. Pairs are drawn one at a time until
    the rule decides, as a sweep runs them."""
    rng = random.Random(seed)
    counts = dict.fromkeys(VERDICTS, 0)
    used: list[int] = []
    for _ in range(decisions):
        x: list[float] = []
        verdict = "undecided"
        while verdict == "undecided":
            sd = outlier_spread if rng.random() < outliers else core
            x.append(math.log(gain) + rng.gauss(0.0, sd))
            verdict = _judge(x, rule, len(x) >= rule.max_pairs)[0]
        counts[verdict] += 1
        used.append(len(x))
    return Simulated(decisions, counts["faster"], counts["slower"], counts["within noise"], tuple(used))
