"""The confirmation rule's error rates, by simulation (iotune.sweep.sequential.simulate,
seeded): what the rule says about a known true ratio under each noise model, with
the counts the project's targets are stated in (docs/benchmarks.md).

Pure computation, no root, a few seconds on one core:

    python benchmarks/sequential_rule.py            # the tables, then the JSON in benchmarks/results/
    python benchmarks/sequential_rule.py --max-pairs 12   # the cap on replay pairs (sequential.REPLAY_MAX_PAIRS)

Per noise model (sd of ln ratio per pair; normal, or a mix with outliers, or
with a first-in-pair advantage that the rule's alternating order cancels):

- A/A (true ratio 1) reported "faster": 150 decisions (target: at most 1);
- at the gain floor (1.05x) reported "faster": 150 decisions (target: at most 5 %);
- 1.10x found ("faster"): 50 decisions (target: 45 or more); 1.15x: 50 (target: 48 or more);
- `noisy` raised in the A/A decisions (target under induced noise: 90 % or more);
- each of these again over 2,000 decisions, for the rate; mean pairs per decision.

Then, with no practical cap on pairs (max_pairs 1,000), how many pairs the
rule takes to find 1.10x and 1.15x at each normal noise level: what
"undecided: about N more pairs" is about.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.sweep.sequential import SequentialRule, Simulated, simulate  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Noise:
    label: str
    core: float
    outliers: float = 0.0
    outlier_spread: float = 0.0
    order_bias: float = 0.0

    def run(self, rule: SequentialRule, gain: float, decisions: int, seed: int) -> Simulated:
        return simulate(rule, gain, self.core, self.outliers, self.outlier_spread, decisions, seed, self.order_bias)


MODELS = (
    Noise("normal 0.5 %", 0.005),
    Noise("normal 2 %", 0.02),
    Noise("normal 5 %", 0.05),
    Noise("normal 10 %", 0.10),
    Noise("normal 15 %", 0.15),
    Noise("2 %, 1 pair in 10 at 10 %", 0.02, 0.1, 0.10),
    Noise("5 %, 1 pair in 10 at 25 %", 0.05, 0.1, 0.25),
    Noise("0.5 %, first runner +-1 %", 0.005, order_bias=0.01),
)
COUNTS = {1.0: 150, 1.05: 150, 1.10: 50, 1.15: 50}     # the targets' own counts
TARGETS = {1.0: "<= 1 of 150", 1.05: "<= 5 %", 1.10: ">= 45 of 50", 1.15: ">= 48 of 50"}
COUNT_SEED, RATE_SEED, RATE_DECISIONS = 1, 2, 2000


def row(noise: Noise, rule: SequentialRule) -> dict[str, Any]:
    """One noise model: counts at the targets' sizes, rates over RATE_DECISIONS."""
    out: dict[str, Any] = {"noise": noise.label, **dataclasses.asdict(noise)}
    for gain, n in COUNTS.items():
        small = noise.run(rule, gain, n, COUNT_SEED)
        big = noise.run(rule, gain, RATE_DECISIONS, RATE_SEED)
        out[f"{gain:.2f}"] = {"faster": small.faster, "of": n, "rate": big.faster_rate,
                              "undecided_rate": big.undecided / big.decisions, "noisy_rate": big.noisy / big.decisions,
                              "mean_pairs": big.mean_pairs, "noisy_of_count": small.noisy}
    out["met"] = {"aa": out["1.00"]["faster"] <= 1, "floor": out["1.05"]["faster"] <= 0.05 * 150,
                  "1.10": out["1.10"]["faster"] >= 45, "1.15": out["1.15"]["faster"] >= 48,
                  "noisy": out["1.00"]["noisy_rate"] >= 0.9}
    return out


def unbounded(core: float, gain: float, decisions: int = 200) -> dict[str, float]:
    """Pairs the rule takes to decide `gain` with no practical cap."""
    s = simulate(SequentialRule(max_pairs=1000), gain, core, decisions=decisions, seed=3)
    return {"found": s.faster / s.decisions, "median_pairs": statistics.median(s.pairs),
            "p90_pairs": sorted(s.pairs)[int(0.9 * len(s.pairs))]}


def pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.1 or not x else f"{100 * x:.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    """The docstring's and the docs' table (fixed width, counts then rates)."""
    head = (f"  {'noise per pair':<26} {'A/A faster':<13} {'1.05x faster':<13} {'1.10x found':<14} "
            f"{'1.15x found':<14} {'noisy':<7} pairs")
    lines = [head]
    for r in rows:
        cells = [f"{r[g]['faster']}/{r[g]['of']} {pct(r[g]['rate'])}" for g in ("1.00", "1.05", "1.10", "1.15")]
        pairs = " ".join(f"{r[g]['mean_pairs']:.1f}" for g in ("1.00", "1.10", "1.15"))
        lines.append(f"  {r['noise']:<26} {cells[0]:<13} {cells[1]:<13} {cells[2]:<14} {cells[3]:<14} "
                     f"{pct(r['1.00']['noisy_rate']):<7} {pairs}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-pairs", type=int, default=SequentialRule().max_pairs,
                   help="the rule's cap on pairs (default: the real steps' 6; the replays' is 12)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    rule = SequentialRule(max_pairs=a.max_pairs)
    rows = [row(m, rule) for m in MODELS]
    far = {f"{100 * core:g} %": {f"{g:.2f}": unbounded(core, g) for g in (1.10, 1.15)}
           for core in (0.02, 0.05, 0.10, 0.15)}
    print(table(rows))
    print(f"\n  targets: {TARGETS}; resolvable spread at the defaults: {100 * rule.resolvable():.2f} % per pair")
    print("\n  no cap on pairs (200 decisions each): found, median pairs, 90th percentile")
    for noise, gains in far.items():
        print(f"  {noise:>6}: " + "; ".join(f"{g}x {pct(v['found'])}, {v['median_pairs']:.0f}, {v['p90_pairs']}"
                                          for g, v in gains.items()))
    cap = "" if a.max_pairs == SequentialRule().max_pairs else f"-{a.max_pairs}pairs"
    out = a.out or ROOT / "benchmarks" / "results" / f"sequential_rule{cap}-{dt.date.today()}.json"
    out.write_text(json.dumps({"rule": dataclasses.asdict(rule), "targets": TARGETS, "rows": rows,
                               "no_cap": far, "seeds": [COUNT_SEED, RATE_SEED]}, indent=1) + "\n")
    print(f"\nresults in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
