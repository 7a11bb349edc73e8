"""The confirmation rule's error rates on real training steps: A/A decisions
(a config against itself) and decisions of a known gain of about 1.15x.

Run by hand, as root, from the repository (results go to benchmarks/results/):

    sudo .venv/bin/python benchmarks/confirm_rule.py --decisions 20

One test bed (iotune/volumes/beds.py, default `bandwidth-only`) carries two
blkio cgroups on its loop device: "base", capped at --cap-mb-per-s for reads
and writes, and "fast", capped --cap-ratio (1.15) times higher. The built-in
workload (StepsExecutor: `tiny` model, optimizer state swapped to the bed,
DeepSpeed's default aio settings, warm starts) runs in one or the other:

- truth: --truth-pairs alternating (fast, base) pairs of --truth-steps steps
  each: the true ratio of the two caps on the optimizer step;
- A/A: the candidate and the defaults both in "base";
- gain: the candidate in "fast", the defaults in "base".

Each decision runs pairs one at a time, in the order the rule gives (the
candidate first in even pairs, the defaults first in odd ones), with the
aio sweep's own loop and rule (iotune.sweep.aio.confirm.run_pairs and the
default profile's rule) until the rule decides or the profile's maximum. A/A and gain decisions
alternate, so machine load falls on both alike. The cap is low (40 MB/s)
on purpose: the blkio throttle works in slices of about 100 ms, so an
optimizer step whose I/O lasts 0.4 s (the bed's own 200 MB/s) moves in
steps of a slice (caps 1.05-1.12x higher gave 1.00x, 1.15x gave 1.29x); at
40 MB/s the step takes 2.2 s and follows the cap.

Output: false positives among the A/A decisions, the gain's detection rate,
pairs per decision (median, max), wall time, the A/A pairs' own noise, and
the machine's load (1-minute load average, CPU busy) per decision. The JSON
is rewritten after every decision; the bed, its cgroups and every file go on
exit, error or Ctrl-C (SIGTERM too).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.host.cgroup import Throttle, blkio_cgroup  # noqa: E402
from iotune.model.sweep import Measurement, SweepPoint, Trial  # noqa: E402
from iotune.sweep.aio.confirm import confirm_rule, run_pairs  # noqa: E402
from iotune.sweep.executor import Target, TrialFailed  # noqa: E402
from iotune.sweep.aio.recommend import pair_ratios  # noqa: E402
from iotune.sweep.sequential import decide  # noqa: E402
from iotune.sweep.space import load_profile  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.volumes.beds import running_bed  # noqa: E402

DEFAULTS = SweepPoint()                        # DeepSpeed's aio defaults, run on both sides
CANDIDATE = SweepPoint(queue_depth=9)          # only a label for run_pairs: the trials run DEFAULTS


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far (/proc/stat)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def trial(ex: StepsExecutor, target: Target, point: SweepPoint, repeat: int) -> tuple[Trial, list[float]]:
    """One run of the built-in workload at DeepSpeed's defaults in `target`'s cgroup."""
    t0 = time.monotonic()
    try:
        m, raw = ex.run(DEFAULTS, target)
        opt = [s["optimizer_step_s"] for s in raw["steps"]]
        return Trial("steps", point, repeat, "ok", m, "", "", time.monotonic() - t0), opt
    except TrialFailed as e:
        say(f"trial failed: {e}")
        return Trial("steps", point, repeat, "failed", None, str(e), "", time.monotonic() - t0), []


def one_decision(ex: StepsExecutor, cand: Target, base: Target, steps_log: list[dict[str, Any]]) -> dict[str, Any]:
    """Pairs (candidate in `cand`, defaults in `base`) until the default profile's rule decides."""
    rule = confirm_rule(load_profile("default").run)

    def measure(point: SweepPoint, repeat: int, order: str) -> Trial:
        role = "candidate" if point == CANDIDATE else "defaults"
        t, opt = trial(ex, cand if role == "candidate" else base, point, repeat)
        steps_log.append({"role": role, "order": order, "status": t.status, "optimizer_step_s": opt,
                          "median_s": t.measurement.optimizer_step_s if t.measurement else None})
        return t

    t0, (b0, j0), load0 = time.monotonic(), cpu_jiffies(), os.getloadavg()[0]
    pairs = run_pairs([CANDIDATE], DEFAULTS, rule, measure)[CANDIDATE.key()]
    b1, j1 = cpu_jiffies()
    d = decide(pair_ratios(pairs), rule)
    return {"verdict": d.verdict, "pairs": len(pairs), "usable_pairs": d.pairs, "ratios": pair_ratios(pairs),
            "center": d.center, "lower": d.lower, "upper": d.upper if math.isfinite(d.upper) else None,
            "more_pairs_needed": d.more_pairs_needed, "noisy": d.noisy, "spread_measured": d.measured,
            "wall_s": round(time.monotonic() - t0, 1), "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "cpu_busy": round((b1 - b0) / max(1, j1 - j0), 3)}


def truth(ex: StepsExecutor, fast: Target, base: Target, pairs: int, steps: int) -> dict[str, Any]:
    """The two caps' ratio on the optimizer step, from long runs in alternating pairs."""
    ratios: list[float] = []
    runs = []
    short, ex.steps = ex.steps, steps            # the same executor (and warm-start server), longer runs
    try:
        for i in range(pairs):
            f, fo = trial(ex, fast, CANDIDATE, i)
            b, bo = trial(ex, base, DEFAULTS, i)
            runs.append({"fast": fo, "base": bo})
            if f.measurement and b.measurement:
                ratios.append(b.measurement.optimizer_step_s / f.measurement.optimizer_step_s)
                say(f"truth pair {i + 1}/{pairs}: {ratios[-1]:.4f} (base {b.measurement.optimizer_step_s:.3f} s, "
                    f"fast {f.measurement.optimizer_step_s:.3f} s)")
    finally:
        ex.steps = short
    return {"pairs": pairs, "steps": steps, "ratios": ratios, "median": statistics.median(ratios) if ratios else None,
            "runs": runs}


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("aa", "gain"):
        ds = res[kind]
        if not ds:
            continue
        n = [d["pairs"] for d in ds]
        out[kind] = {"decisions": len(ds), "faster": sum(d["verdict"] == "faster" for d in ds),
                     "verdicts": {v: sum(d["verdict"] == v for d in ds)
                                  for v in ("faster", "slower", "within noise", "undecided")},
                     "pairs_median": statistics.median(n), "pairs_max": max(n), "pairs_mean": statistics.mean(n),
                     "wall_s": round(sum(d["wall_s"] for d in ds), 1)}
    if res["aa"]:
        x = [math.log(r) for d in res["aa"] for r in d["ratios"]]
        m = statistics.median(x)
        out["aa_pair_noise"] = {"pairs": len(x), "sd": statistics.stdev(x) if len(x) > 1 else None,
                                "mad_sd": 1.4826 * statistics.median(abs(v - m) for v in x),
                                "beyond_5pct": sum(abs(v) > 0.05 for v in x)}
    if "gain" in out:
        out["gain"]["detection_rate"] = out["gain"]["faster"] / out["gain"]["decisions"]
    return out


def caps(bed: Any, bytes_per_s: float) -> list[Throttle]:
    return [Throttle(d.number, read_bps=int(bytes_per_s), write_bps=int(bytes_per_s)) for d in bed.devices]


def run(a: argparse.Namespace, res: dict[str, Any], save: Callable[[], None]) -> None:
    cap = a.cap_mb_per_s * 1e6
    with contextlib.ExitStack() as stack:
        bed = stack.enter_context(running_bed(a.bed))
        base_cg = stack.enter_context(blkio_cgroup("confirm-base", caps(bed, cap)))
        fast_cg = stack.enter_context(blkio_cgroup("confirm-fast", caps(bed, cap * a.cap_ratio)))
        ex = StepsExecutor(steps=a.steps)
        stack.callback(ex.close)
        base, fast = Target(bed.path, cgroup=str(base_cg)), Target(bed.path, cgroup=str(fast_cg))
        if a.truth_pairs:
            say(f"truth: {a.truth_pairs} pairs of {a.truth_steps} steps, caps {a.cap_mb_per_s:g} and "
                f"{a.cap_mb_per_s * a.cap_ratio:g} MB/s")
            res["truth"] = truth(ex, fast, base, a.truth_pairs, a.truth_steps)
            save()
        for i in range(a.decisions):
            for kind, cand in (("aa", base), ("gain", fast)):
                d = one_decision(ex, cand, base, res["steps"].setdefault(f"{kind}-{i}", []))
                res[kind].append(d)
                res["summary"] = summarize(res)
                save()
                say(f"{kind} {i + 1}/{a.decisions}: {d['verdict']} after {d['pairs']} pair(s), geometric mean "
                    f"{d['center']:.3f} [{d['lower']:.3f}-{d['upper'] or math.inf:.3f}], {d['wall_s']:.0f} s, "
                    f"load {d['load_1min'][1]}")
        res["notes"] = ex.notes


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt           # SIGTERM unwinds like Ctrl-C: the bed comes down


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bed", default="bandwidth-only")
    p.add_argument("--decisions", type=int, default=20, help="decisions of each kind (A/A and gain)")
    p.add_argument("--cap-mb-per-s", type=float, default=40.0, help="the base cgroup's cap, MB/s (decimal)")
    p.add_argument("--cap-ratio", type=float, default=1.15, help="the fast cgroup's cap / the base's")
    p.add_argument("--steps", type=int, default=4, help="training steps per trial (medians over all but the first)")
    p.add_argument("--truth-pairs", type=int, default=5)
    p.add_argument("--truth-steps", type=int, default=12)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    out = a.out or ROOT / "benchmarks" / "results" / f"confirm_rule-{dt.date.today()}.json"
    rule = confirm_rule(load_profile("default").run)
    res: dict[str, Any] = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                    capture_output=True, text=True).stdout.strip(),
                           "args": {k: str(v) for k, v in vars(a).items()}, "rule": dataclasses.asdict(rule),
                           "aa": [], "gain": [], "steps": {}}
    t0 = time.monotonic()

    def save() -> None:
        res["wall_s"] = round(time.monotonic() - t0, 1)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(out)

    try:
        run(a, res, save)
    finally:
        res["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        save()
    say(f"results in {out}: {json.dumps(res.get('summary', {}))}")


if __name__ == "__main__":
    main()
