#!/usr/bin/env python3
"""Report scale (issue 10): a 24-hour trace at 1 s intervals on 8 devices,
rendered as the console report and as the HTML report.

Run by hand from the repository root (no root needed, nothing is traced):

    .venv/bin/python benchmarks/html_scale.py --rounds 5

The run is synthetic: 86,400 intervals x 8 devices x (read, write) =
1,382,400 timeline points, each device with its own smooth daily load
(a sine plus a 60 s square wave) and one single-interval spike of 50x the
usual peak at a known time, which the HTML must still show. Each round
renders the same in-memory run (loading run.json is not timed, nor is the
verdict: the report is rendered without one) and the script prints every round's seconds, the median and the spread (max - min)
/ median, the HTML size, and whether each device's spike survived the
downsampling; with --json the figures go to a file.

With --from-disk it times what a user waits for instead: the whole
`iotune report RUN` command (and with --html FILE) on the run saved to disk
-- interpreter start, loading timeline.csv, the verdict and the rendering.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iotune.errors import UsageError  # noqa: E402
from iotune.model.histogram import lat_slot  # noqa: E402
from iotune.model.run import DeviceStats, DirectionStats, TimelinePoint, TraceRun  # noqa: E402
from iotune.model.verdict import TraceReport  # noqa: E402
from iotune.render.page import figure_specs  # noqa: E402
from iotune.render.registry import render  # noqa: E402

DAY_S = 86_400
DEVICES = 8
BLOCK = 512 * 1024
SPIKE_REQUESTS = 5_000          # 50x the usual peak of 100 requests per second


def spike_at(dev: int) -> int:
    """The interval of device `dev`'s spike (distinct for every device)."""
    return 7_919 * (dev + 1) % DAY_S


def day_run(seconds: int = DAY_S, devices: int = DEVICES) -> TraceRun:
    points = []
    for d in range(devices):
        name = f"nvme{d}n1"
        for i in range(seconds):
            base = 50 + 40 * math.sin(2 * math.pi * (i + 3_600 * d) / seconds) + (10 if (i // 60) % 2 else 0)
            for op, share in (("read", 1.0), ("write", 0.5)):
                n = SPIKE_REQUESTS if (op == "read" and i == spike_at(d)) else int(base * share)
                points.append(TimelinePoint(float(i), name, op, n, n * BLOCK))
    devs = tuple(
        DeviceStats(259, d, f"nvme{d}n1", directions={
            op: DirectionStats(op=op, requests=1_000, bytes=1_000 * BLOCK, completed=1_000,
                               lat_sum_ns=1_000 * 800_000, sizes={BLOCK: 1_000}, size_log2={20: 1_000},
                               lat_slots={lat_slot(800_000): 1_000}, depth={8: 1_000})
            for op in ("read", "write")})
        for d in range(devices))
    return TraceRun(run_id="day", started_at="2026-11-23T00:00:00+00:00", duration_s=float(seconds),
                    interval_s=1.0, command=("python", "train.py"), devices=devs, timeline=tuple(points))


def timed(fn, rounds: int) -> tuple[list[float], list[float], object]:
    """Wall-clock and CPU seconds of each round (CPU time shows what the
    rendering costs when other processes share the cores)."""
    wall, cpu, result = [], [], None
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return wall, cpu, result


def spikes_survive(html: str, devices: int) -> bool:
    """Every device's spike shows at its full MB/s in the timeline's top line
    (the per-bucket maximum), in the bucket that holds its interval."""
    data, _ = figure_specs(html)[0]
    peak_mb_s = SPIKE_REQUESTS * BLOCK / 1e6
    ok = 0
    for d in range(devices):
        top = next(t for t in data if t["yaxis"] == "y" and t["name"] in (f"nvme{d}n1 read max", f"nvme{d}n1 read"))
        i = max(range(len(top["y"])), key=lambda k: top["y"][k])
        ok += abs(top["y"][i] - peak_mb_s) < 1e-3 * peak_mb_s and i * top["dx"] <= spike_at(d) < (i + 1) * top["dx"]
    return ok == devices


def console_report(report: TraceReport) -> str:
    """The console trace report (of the run alone where no TraceReport renderer is registered yet)."""
    try:
        return render(report, "console")
    except UsageError:
        return render(report.run, "console")


def summary(wall: list[float], cpu: list[float]) -> dict[str, object]:
    med = statistics.median(wall)
    return {"seconds": [round(s, 3) for s in wall], "median_s": round(med, 3),
            "spread": round((max(wall) - min(wall)) / med, 3),
            "cpu_seconds": [round(s, 3) for s in cpu], "cpu_median_s": round(statistics.median(cpu), 3)}


def from_disk(run: TraceRun, rounds: int, out: Path | None) -> None:
    """Whole `iotune report` commands on the saved run, CPU from the children's rusage."""
    import resource
    import subprocess
    import tempfile

    from iotune.model.runfile import save_run

    with tempfile.TemporaryDirectory(prefix="iotune-day-") as tmp:
        save_run(run, Path(tmp) / "run")
        size = (Path(tmp) / "run" / "timeline.csv").stat().st_size
        html = Path(tmp) / "day.html"
        commands = {"console": [sys.executable, "-m", "iotune", "report", str(Path(tmp) / "run")],
                    "html": [sys.executable, "-m", "iotune", "report", str(Path(tmp) / "run"), "--html", str(html)]}
        figures: dict[str, object] = {"timeline_points": len(run.timeline), "timeline_csv_bytes": size,
                                      "python": platform.python_version(), "cpus": os.cpu_count()}
        for what, cmd in commands.items():
            wall, cpu = [], []
            for _ in range(rounds):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=Path(__file__).resolve().parent.parent)
                wall.append(time.perf_counter() - t)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            figures[what] = summary(wall, cpu)
            med = statistics.median(wall)
            print(f"iotune report ({what}): median {med:.2f} s (CPU {statistics.median(cpu):.2f} s), "
                  f"spread {100 * (max(wall) - min(wall)) / med:.0f}%, rounds {[round(w, 2) for w in wall]}")
        figures["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if out:
        out.write_text(json.dumps(figures, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=DAY_S)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--from-disk", action="store_true",
                    help="time the whole `iotune report RUN` command instead (console, then --html): the "
                         "run saved to a scratch directory, loaded, judged (verdict) and rendered, "
                         "interpreter start included")
    args = ap.parse_args()
    t = time.perf_counter()
    run = day_run(args.seconds)
    build_s = time.perf_counter() - t
    print(f"synthetic run: {len(run.timeline):,} timeline points, built in {build_s:.1f} s (not timed below)")
    if args.from_disk:
        from_disk(run, args.rounds, args.json)
        return
    report = TraceReport(run, None)
    console_wall, console_cpu, text = timed(lambda: console_report(report), args.rounds)
    html_wall, html_cpu, doc = timed(lambda: render(report, "html"), args.rounds)
    html = str(doc)
    figures = {"timeline_points": len(run.timeline), "console": summary(console_wall, console_cpu),
               "html": summary(html_wall, html_cpu),
               "html_bytes": len(html.encode()), "spikes_survive": spikes_survive(html, DEVICES),
               "console_chars": len(str(text)), "python": platform.python_version(),
               "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    for what in ("console", "html"):
        s = figures[what]
        print(f"{what:8}: median {s['median_s']} s (CPU {s['cpu_median_s']} s), spread {100 * s['spread']:.0f}%, "
              f"rounds {s['seconds']}")
    print(f"html size: {figures['html_bytes'] / 1e6:.2f} MB; every device's 1-interval spike survives: "
          f"{figures['spikes_survive']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
