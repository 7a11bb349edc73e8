"""The confirmation rule's error rates in real noise: decisions on replays of
a job's swap I/O through DeepSpeed's aio handle, as the aio sweep and the
offload search make them (iotune.sweep.replay_pairs).

Run by hand, as root, from the repository, alone on the machine (results go
to benchmarks/results/):

    sudo .venv/bin/python benchmarks/rule_on_replays.py --aa 60 --gain 30
    sudo .venv/bin/python benchmarks/rule_on_replays.py --latency-ms 40 --overhead-ms 4.5 --aa 40 --gain 50 --per-child 20

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
- With --latency-ms L, a quiet workload whose gains are continuous: no caps
  (a blkio throttle charges in slices of about 100 ms, so small byte
  differences time alike or a slice apart), but emulated drives whose every
  request takes a set latency, 64 at once (iotune.volumes.emulated, FUSE).
  The reference replays on a drive of latency L; a gain g's candidate
  replays the same bytes on a drive of its own, of latency (L + o) / g - o,
  o being the per-request cost beyond the latency (--overhead-ms). DeepSpeed's
  default 8 x 1 MiB in flight keep these drives latency-bound, so the time
  scales with the latency plus o; the true ratio is measured anyway, from
  the long run as above. The replayer lays each schedule's files in their
  own directory; the candidates' are links to their drives.

Each decision is up to --max-pairs ABBA pairs (default: the sweeps' cap on
replay pairs, iotune.sweep.sequential.REPLAY_MAX_PAIRS, 12; the runs before
it used 6) of the default rule (iotune.sweep.sequential.SequentialRule),
looked at as the search looks (iotune.sweep.replay_pairs: after 3 pairs,
then every 3 more), so its verdict is the one it reaches pair by pair. --per-child decisions share a replayer child
per look (its start, about 3 s, is not what is measured): the first child
runs every decision's first look, the next one the next look of those still
undecided (with --all-pairs, every decision runs all its pairs in one child,
as the first runs did). Reported per kind: "faster"
count, "slower", "within noise", "undecided", pairs used, the noisy flag,
and the measured per-pair spread (sd of ln ratio); the machine and its CPU
flags. The results file is rewritten after every child.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.host.ledger import temp_dir  # noqa: E402
from iotune.model.aio import AioSettings  # noqa: E402
from iotune.model.drive import DriveLimits  # noqa: E402
from iotune.model.replay import AIO_ALIGNED_BYTES, SwapSchedule  # noqa: E402
from iotune.model.sweep import SweepPoint  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.sweep.executor import Target  # noqa: E402
from iotune.sweep.replay import run_replay_plan  # noqa: E402
from iotune.sweep.replay_pairs import pair_orders  # noqa: E402
from iotune.sweep.sequential import REPLAY_MAX_PAIRS, SequentialRule, decide, decide_by_looks  # noqa: E402
from iotune.volumes.beds import running_bed  # noqa: E402
from iotune.volumes.emulated import emulated_drive  # noqa: E402

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
    d = decide_by_looks(ratios, rule)
    return {"verdict": d.verdict, "pairs": d.pairs, "center": round(d.center, 5), "noisy": d.noisy,
            "spread": round(d.spread, 5), "measured": round(d.measured, 5)}


def linked_directory(child: contextlib.ExitStack, paths: list[Path]) -> Path:
    """A fresh directory for one replayer child on the first drive of `paths`, its s<k> linking a
    fresh directory on drive k (schedule k's files go there); all removed when `child` closes."""
    directory = temp_dir(child, ".rule-replay-", paths[0])
    for k, path in enumerate(paths[1:], 1):
        (directory / f"s{k}").symlink_to(temp_dir(child, ".rule-replay-", path))
    return directory


def gain_latency_us(latency_us: float, overhead_us: float, gain: float) -> float:
    """The latency of the drive on which a request takes 1/gain of the reference drive's time."""
    return (latency_us + overhead_us) / gain - overhead_us


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
    ap.add_argument("--latency-ms", type=float, default=None,
                    help="known gains from drive latency: emulated drives without caps, the reference's of this "
                         "latency, each gain's faster by its ratio (no bed, no --path)")
    ap.add_argument("--overhead-ms", type=float, default=0.5,
                    help="with --latency-ms: the per-request cost beyond the latency, in ms, that the gains' "
                         "latencies allow for (default 0.5; the true ratios are measured either way)")
    ap.add_argument("--size", default="tiny", help="the built-in model whose step is recorded")
    ap.add_argument("--aa", type=int, default=60, help="A/A decisions")
    ap.add_argument("--gain", type=int, default=30, help="decisions per known gain")
    ap.add_argument("--gains", default="1.05,1.10,1.15")
    ap.add_argument("--max-pairs", type=int, default=REPLAY_MAX_PAIRS,
                    help=f"pairs per decision, at most (default {REPLAY_MAX_PAIRS}: the sweeps' replay cap)")
    ap.add_argument("--per-child", type=int, default=10, help="decisions per replayer child")
    ap.add_argument("--all-pairs", action="store_true",
                    help="run all max_pairs pairs of every decision in one child (the looks are the same)")
    ap.add_argument("--contend", type=int, default=0, help="busy processes beside the replays (CPU contention)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.latency_ms is not None and a.path is not None:
        ap.error("--latency-ms brings its own drives: leave out --path")
    rule = SequentialRule(max_pairs=a.max_pairs)
    gains = [1.0] + [float(g) for g in a.gains.split(",") if g]
    counts = {1.0: a.aa, **{g: a.gain for g in gains[1:]}}
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    where = (f"latency{a.latency_ms:g}ms" if a.latency_ms is not None else
             a.bed if a.path is None else "uncapped")
    out = a.out or ROOT / "benchmarks" / "results" / f"rule_on_replays-{a.size}-{where}-c{a.contend}-{stamp}.json"
    doc: dict[str, Any] = {"benchmark": "rule_on_replays", "bed": a.bed, "size": a.size, "contend": a.contend,
                           "rule": dataclasses.asdict(rule), "machine": machine(),
                           "argv": sys.argv[1:], "started": dt.datetime.now().isoformat(timespec="seconds"),
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
            place: Callable[[contextlib.ExitStack], Path | None] = lambda child: None
            if a.latency_ms is not None:
                drives = {g: stack.enter_context(emulated_drive(
                    None, 1 << 30, DriveLimits(latency_us=gain_latency_us(a.latency_ms * 1000, a.overhead_ms * 1000, g),
                                               parallelism=64), fstype="ext4")) for g in gains}
                doc["bed"] = "latency drives, no caps"
                doc["drives"] = {str(g): dataclasses.asdict(d.limits) for g, d in drives.items()}
                target = Target(temp_dir(stack, ".rule-", drives[1.0].path))
            elif a.path is None:
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
            # every schedule in every child, so schedule k's files are the replayer's s<k> (distinct files each)
            if a.latency_ms is not None:
                entries = [(base, aio)] + [(base.under(f"g{g:g}/"), aio) for g in gains[1:]]
                place = functools.partial(linked_directory, paths=[drives[g].path for g in gains])
            else:
                entries = [(base, aio)] + [(scaled(base, g), aio) for g in gains[1:]]
            index = {g: k for k, g in enumerate(gains)}
            # decisions interleaved by kind, so the machine's drift falls on every kind alike
            queue = [g for i in range(max(counts.values())) for g in gains if i < counts[g]]
            for start in range(0, len(queue), a.per_child):
                chunk = queue[start:start + a.per_child]
                for g, ratios in zip(chunk, decide_chunk(chunk, index, entries, target, place, rule, a.all_pairs)):
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


def decide_chunk(chunk: list[float], index: dict[float, int], entries: list[tuple[SwapSchedule, AioSettings]],
                 target: Target, place: Callable[[contextlib.ExitStack], Path | None], rule: SequentialRule,
                 all_pairs: bool) -> list[list[float]]:
    """Each decision's pair ratios (reference / candidate), a replayer child per look: the decisions
    the rule has not settled get their next look's pairs (all max_pairs at once with `all_pairs`)."""
    ratios: list[list[float]] = [[] for _ in chunk]
    live = list(range(len(chunk)))
    n = 0
    while live and n < rule.max_pairs:
        count = rule.max_pairs if all_pairs else min(rule.first_look, rule.max_pairs - n)
        seq = pair_orders(n, count)            # 1: the candidate, 0: the reference
        order = [index[chunk[j]] if i == 1 else 0 for j in live for i in seq]
        with contextlib.ExitStack() as child:
            results = [r.seconds for _, r in run_replay_plan(entries, order, target, directory=place(child))]
        for at, j in enumerate(live):
            mine = results[at * len(seq):(at + 1) * len(seq)]
            ref = [t for t, i in zip(mine, seq) if i == 0]
            cand = [t for t, i in zip(mine, seq) if i == 1]
            ratios[j] += [r / c for r, c in zip(ref, cand)]
        n += count
        live = [j for j in live if not decide(ratios[j], rule).decided]
    return ratios


if __name__ == "__main__":
    sys.exit(main())
