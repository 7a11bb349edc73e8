"""The confirmation rule's error rates in real noise: decisions on replays of
a job's swap I/O through DeepSpeed's aio handle, as the aio sweep and the
offload search make them (iotune.sweep.replay_pairs).

Run by hand, as root, from the repository, alone on the machine (results go
to benchmarks/results/):

    sudo .venv/bin/python benchmarks/rule_on_replays.py --aa 60 --gain 30

The simulated error rates (benchmarks/sequential_rule.py) assume normal
noise of a given spread; here the noise is the machine's own: each pair is
two real replays of the built-in model's recorded optimizer step (its swap
schedule without its compute, so the drive decides the time) on a test bed
whose cap is known (`bandwidth-only`: 200 MB/s, iotune/volumes/beds.py).

- A/A: the schedule against itself, same aio settings.
- A known gain g (1.05, 1.10, 1.15 by default): the candidate moves 1/g of
  the reference's bytes (each op's size divided by g, on DeepSpeed's 1 KiB
  alignment), so at the bed's bandwidth cap it takes 1/g of the time.
  Its true ratio is taken from the long run: the geometric mean over every
  pair measured for it.
- With --contend N, N busy processes (one `sha256sum /dev/zero` each) run
  for the whole benchmark: CPU contention, the noise of a shared machine.

Each decision is up to max_pairs (6) ABBA pairs of the default rule
(iotune.sweep.sequential.SequentialRule), all run in one replayer child
with other decisions' pairs (a child per --per-child decisions: the child's
start, about 3 s, is not what is measured); the rule then looks as the
search does (after 3 pairs, then 6: replay_pairs' looks), so its verdict is
the one it would have reached pair by pair. Reported per kind: "faster"
count, "slower", "within noise", "undecided", pairs used, the noisy flag,
and the measured per-pair spread (sd of ln ratio); the machine and its CPU
flags. The results file is rewritten after every child.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.model.aio import AioSettings  # noqa: E402
from iotune.model.replay import AIO_ALIGNED_BYTES, SwapSchedule  # noqa: E402
from iotune.model.sweep import SweepPoint  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.sweep.executor import Target  # noqa: E402
from iotune.sweep.replay import run_replay_plan  # noqa: E402
from iotune.sweep.replay_pairs import pair_orders  # noqa: E402
from iotune.sweep.sequential import SequentialRule, decide  # noqa: E402
from iotune.volumes.beds import running_bed  # noqa: E402

from benchmarks.machine import machine  # noqa: E402


def scaled(schedule: SwapSchedule, gain: float) -> SwapSchedule:
    """`schedule` moving 1/gain of its bytes (each op, on the 1 KiB alignment)."""
    def op_size(n: int) -> int:
        return max(AIO_ALIGNED_BYTES, round(n / gain / AIO_ALIGNED_BYTES) * AIO_ALIGNED_BYTES)
    groups = tuple(dataclasses.replace(g, ops=tuple(dataclasses.replace(op, size_bytes=op_size(op.size_bytes))
                                                    for op in g.ops)) for g in schedule.groups)
    return dataclasses.replace(schedule, groups=groups)


def looks(ratios: list[float], rule: SequentialRule) -> dict[str, Any]:
    """The rule's decision as replay_pairs reaches it: a look after each batch of first_look pairs."""
    n = 0
    d = decide([], rule)
    while n < rule.max_pairs and not d.decided:
        n = min(n + rule.first_look, rule.max_pairs)
        d = decide(ratios[:n], rule)
    return {"verdict": d.verdict, "pairs": d.pairs, "center": round(d.center, 5), "noisy": d.noisy,
            "spread": round(d.spread, 5), "measured": round(d.measured, 5)}


def summary(decisions: list[dict[str, Any]], pair_ratios: list[float]) -> dict[str, Any]:
    verdicts = [d["verdict"] for d in decisions]
    logs = [math.log(r) for r in pair_ratios]
    return {"decisions": len(decisions), **{v: verdicts.count(v) for v in ("faster", "slower", "within noise",
                                                                           "undecided")},
            "noisy": sum(d["noisy"] for d in decisions),
            "pairs_median": statistics.median(d["pairs"] for d in decisions) if decisions else None,
            "pairs_max": max((d["pairs"] for d in decisions), default=None),
            "true_ratio": round(math.exp(statistics.fmean(logs)), 4) if logs else None,
            "per_pair_sd": round(statistics.stdev(logs), 4) if len(logs) > 1 else None,
            "pairs_measured": len(logs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bed", default="bandwidth-only")
    ap.add_argument("--path", type=Path, default=None,
                    help="replay in this directory, uncapped (no bed): the host's own drive")
    ap.add_argument("--size", default="tiny", help="the built-in model whose step is recorded")
    ap.add_argument("--aa", type=int, default=60, help="A/A decisions")
    ap.add_argument("--gain", type=int, default=30, help="decisions per known gain")
    ap.add_argument("--gains", default="1.05,1.10,1.15")
    ap.add_argument("--per-child", type=int, default=10, help="decisions per replayer child")
    ap.add_argument("--contend", type=int, default=0, help="busy processes beside the replays (CPU contention)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    rule = SequentialRule()
    gains = [1.0] + [float(g) for g in a.gains.split(",") if g]
    counts = {1.0: a.aa, **{g: a.gain for g in gains[1:]}}
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    where = a.bed if a.path is None else "uncapped"
    out = a.out or ROOT / "benchmarks" / "results" / f"rule_on_replays-{a.size}-{where}-c{a.contend}-{stamp}.json"
    doc: dict[str, Any] = {"benchmark": "rule_on_replays", "bed": a.bed, "size": a.size, "contend": a.contend,
                           "rule": dataclasses.asdict(rule), "machine": machine(),
                           "started": dt.datetime.now().isoformat(timespec="seconds"),
                           "kinds": {str(g): {"decisions": [], "pair_ratios": []} for g in gains}}

    def save() -> None:
        for g in gains:
            k = doc["kinds"][str(g)]
            k["summary"] = summary(k["decisions"], k["pair_ratios"])
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, out)

    t0 = time.monotonic()
    busy = [subprocess.Popen(["sha256sum", "/dev/zero"], stdout=subprocess.DEVNULL) for _ in range(a.contend)]
    ex = StepsExecutor(steps=4, size=a.size)
    try:
        with contextlib.ExitStack() as stack:
            if a.path is None:
                bed = stack.enter_context(running_bed(a.bed, size_bytes=4 << 30))
                target = Target(bed.path, cgroup=bed.cgroup)
            else:
                target = Target(Path(stack.enter_context(tempfile.TemporaryDirectory(dir=a.path))))
                doc["bed"] = f"uncapped: {a.path}"
            _, raw = ex.run(SweepPoint(), target, record_schedule=True)
            ex.close()
            if not isinstance(raw.get("schedule"), dict):
                print(f"no schedule: {raw.get('schedule_error')}", file=sys.stderr)
                return 1
            base = SwapSchedule.from_json(raw["schedule"]).without_compute()
            doc["schedule"] = {"read_bytes": base.read_bytes, "write_bytes": base.write_bytes,
                               "waits": len(base.groups)}
            aio = AioSettings()
            # decisions interleaved by kind, so the machine's drift falls on every kind alike
            queue = [g for i in range(max(counts.values())) for g in gains if i < counts[g]]
            for start in range(0, len(queue), a.per_child):
                chunk = queue[start:start + a.per_child]
                entries: list[tuple[SwapSchedule, AioSettings]] = [(base, aio)]
                index = {1.0: 0}
                for g in gains[1:]:
                    if g in chunk:
                        index[g] = len(entries)
                        entries.append((scaled(base, g), aio))
                order: list[int] = []
                for g in chunk:      # each decision: max_pairs ABBA pairs of (reference 0, candidate)
                    cand = index[g]
                    order += [cand if i == 1 else 0 for i in pair_orders(0, rule.max_pairs)]
                results = [r.seconds for _, r in run_replay_plan(entries, order, target)]
                at = 0
                for g in chunk:
                    seq = pair_orders(0, rule.max_pairs)
                    mine = results[at:at + len(seq)]
                    at += len(seq)
                    ref = [s for s, i in zip(mine, seq) if i == 0]
                    cand = [s for s, i in zip(mine, seq) if i == 1]
                    ratios = [r / c for r, c in zip(ref, cand)]
                    kind = doc["kinds"][str(g)]
                    kind["pair_ratios"] += [round(r, 5) for r in ratios]
                    kind["decisions"].append(looks(ratios, rule))
                save()
                done = start + len(chunk)
                print(f"{done} of {len(queue)} decisions ({time.monotonic() - t0:.0f} s): " + "; ".join(
                    f"{g}: {doc['kinds'][str(g)]['summary']['faster']} faster of "
                    f"{doc['kinds'][str(g)]['summary']['decisions']}" for g in gains), file=sys.stderr)
    finally:
        ex.close()
        for p in busy:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
        doc["wall_s"] = round(time.monotonic() - t0, 1)
        save()
    for g in gains:
        print(f"{g}: {json.dumps(doc['kinds'][str(g)]['summary'])}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
