"""Does the replay rank aio settings as real training steps do?

Run by hand, as root, from the repository, alone on the machine (results go
to benchmarks/results/):

    sudo .venv/bin/python benchmarks/replay_rank.py --bed latency-bound --rounds 3

The aio sweep ranks its finalists on replays of the job's own swap I/O
(iotune/sweep/aio/replay_rank.py) because real steps at the sizes users train
vary by 9-14 % from run to run and take minutes each. This checks that
ranking against the truth it stands for, on more candidates than a sweep
sends to it:

1. The recording run: one real-step trial of the built-in model (default
   `wide`: one Llama layer 1536 wide, 41 M parameters, every 2-D weight
   above the largest block here, so a block size never changes *which*
   tensors are swapped) at DeepSpeed's defaults, its optimizer state on the
   bed's drive, with iotune's startup hook: the swap schedule of a steady
   step, as the sweep records it.
2. Each round, in an order rotated by one each round: every candidate's
   replay (one replayer child for all, each schedule as DeepSpeed swaps it at
   the candidate's block size), then every candidate's real-step trial
   (--steps steps, the first dropped, the median of the rest).
3. Spearman's rank correlation between the candidates' median replay time
   and their median real optimizer step (the part of the step the replay
   stands for), and their median whole step; with every sample, each
   candidate's spread, and the count.

The bed's caps are known (iotune/volumes/beds.py), so the candidates'
bytes in flight (block_size x queue_depth) set their speed: on the
latency-bound bed (40 ms per request, up to 64 at once, 600 MB/s) a request
of B bytes at queue depth Q moves Q x B per 40 ms. The default candidates
span 51-600 MB/s, with pairs of equal bytes in flight (512K x 8 and 1M x 4)
where only per-request costs differ: a ranking that only has to tell 10x
apart would prove little.

The results file is rewritten after every trial; drives, mounts and cgroups
go on exit, error, Ctrl-C and (through iotune's ledger) SIGKILL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.model.replay import SwapSchedule  # noqa: E402
from iotune.model.sweep import SweepPoint  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.sweep.executor import Target  # noqa: E402
from iotune.sweep.replay import run_replay_plan  # noqa: E402
from iotune.model.units import parse_size  # noqa: E402
from iotune.volumes.beds import running_bed  # noqa: E402

from benchmarks.machine import machine  # noqa: E402

DEFAULT_CANDIDATES = "512K:8,1M:4,1M:8,2M:4,1M:16,2M:8,4M:8,8M:8"


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        out = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    sa = sum((x - ma) ** 2 for x in ra) ** 0.5
    sb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (sa * sb) if sa and sb else 0.0


def candidates(spec: str) -> list[SweepPoint]:
    out = []
    for item in spec.split(","):
        bs, _, qd = item.partition(":")
        out.append(SweepPoint(block_size=parse_size(bs), queue_depth=int(qd)))
    return out


def name(p: SweepPoint) -> str:
    return f"bs={p.block_size // 1024}K qd={p.queue_depth}"


def spread(xs: list[float]) -> float:
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / med if med > 0 else 0.0


def summarize(doc: dict[str, Any]) -> None:
    rows = doc["candidates"]
    done = [r for r in rows if r["replay_s"] and r["optimizer_step_s"]]
    for r in done:
        r["median_replay_s"] = statistics.median(r["replay_s"])
        r["median_optimizer_step_s"] = statistics.median(r["optimizer_step_s"])
        r["median_step_s"] = statistics.median(r["step_s"])
        r["replay_spread"] = round(spread(r["replay_s"]), 4)
        r["optimizer_step_spread"] = round(spread(r["optimizer_step_s"]), 4)
    if len(done) >= 3:
        rep = [r["median_replay_s"] for r in done]
        doc["spearman_optimizer_step"] = round(spearman(rep, [r["median_optimizer_step_s"] for r in done]), 4)
        doc["spearman_step"] = round(spearman(rep, [r["median_step_s"] for r in done]), 4)
        doc["replay_pick"] = min(done, key=lambda r: r["median_replay_s"])["name"]
        doc["real_pick"] = min(done, key=lambda r: r["median_optimizer_step_s"])["name"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bed", default="latency-bound")
    ap.add_argument("--size", default="wide", help="built-in model (iotune/workloads/presets.py)")
    ap.add_argument("--candidates", default=DEFAULT_CANDIDATES, help="block_size:queue_depth, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="training steps per real trial (the first is dropped)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    points = candidates(a.candidates)
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = a.out or ROOT / "benchmarks" / "results" / f"replay_rank-{a.size}-{a.bed}-{stamp}.json"
    doc: dict[str, Any] = {"benchmark": "replay_rank", "bed": a.bed, "size": a.size, "rounds": a.rounds,
                           "steps": a.steps, "machine": machine(), "started": dt.datetime.now().isoformat(),
                           "candidates": [{"name": name(p), "point": p.to_json(), "replay_s": [], "step_s": [],
                                           "optimizer_step_s": []} for p in points]}

    def save() -> None:
        summarize(doc)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, out)

    t0 = time.monotonic()
    ex = StepsExecutor(steps=a.steps, size=a.size)
    try:
        with running_bed(a.bed, size_bytes=8 << 30) as bed:
            target = Target(bed.path, cgroup=bed.cgroup)
            print(f"recording the swap schedule at DeepSpeed's defaults on {a.bed} ({a.size})", file=sys.stderr)
            m, raw = ex.run(SweepPoint(), target, record_schedule=True)
            if not isinstance(raw.get("schedule"), dict):
                print(f"no schedule: {raw.get('schedule_error')}", file=sys.stderr)
                return 1
            schedule = SwapSchedule.from_json(raw["schedule"])
            doc["recording"] = {"step_s": m.step_s, "optimizer_step_s": m.optimizer_step_s,
                                "traced_s": schedule.traced_s, "read_bytes": schedule.read_bytes,
                                "write_bytes": schedule.write_bytes, "waits": len(schedule.groups)}
            save()
            for rnd in range(a.rounds):
                order = [(i + rnd) % len(points) for i in range(len(points))]
                entries = [(schedule.swapped_at(p.block_size), p.aio()) for p in points]
                for i, r in run_replay_plan(entries, order, target):
                    doc["candidates"][i]["replay_s"].append(round(r.seconds, 4))
                    print(f"round {rnd + 1}: replay {name(points[i])}: {r.seconds:.2f} s", file=sys.stderr)
                save()
                for i in order:
                    m, _ = ex.run(points[i], target)
                    row = doc["candidates"][i]
                    row["step_s"].append(round(m.step_s or 0.0, 4))
                    row["optimizer_step_s"].append(round(m.optimizer_step_s or 0.0, 4))
                    print(f"round {rnd + 1}: real {name(points[i])}: step {m.step_s:.2f} s, optimizer "
                          f"{m.optimizer_step_s:.2f} s ({time.monotonic() - t0:.0f} s in)", file=sys.stderr)
                    save()
    finally:
        ex.close()
        doc["wall_s"] = round(time.monotonic() - t0, 1)
        save()
    print(f"Spearman (replay vs real optimizer step) {doc.get('spearman_optimizer_step')}, vs whole step "
          f"{doc.get('spearman_step')}; picks: replay {doc.get('replay_pick')}, real {doc.get('real_pick')}; "
          f"{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
