"""Issue 9's benchmark, one test bed per run: DeepSpeed's defaults vs
ds_nvme_tune's pick vs iotune's recommendation, on real optimizer steps.

Run by hand, as root, from the repository (results go to benchmarks/results/):

    .venv/bin/python benchmarks/beds_vs_ds_nvme_tune.py --bed striped
    .venv/bin/python benchmarks/beds_vs_ds_nvme_tune.py --bed latency-bound \\
        --iotune-result benchmarks/results/sweep_bed-latency-bound-2026-11-23.json

Phases, in this order, each written to the JSON as it ends:

  iotune        `iotune sweep --bed BED --json` as a user runs it (its own bed
                instance, default profile: adaptive fio search, then real steps
                against the defaults), timed end to end; or, with
                --iotune-result, a saved outcome of that same command
  ds_nvme_tune  DeepSpeed's tuner with its default grid on a second instance
                of the bed, inside the bed's blkio cgroup, timed end to end;
                its printed aio block is fixed the way a user must fix it
                (num_threads -> intra_op_parallelism, "true"/"false" strings ->
                booleans) before DeepSpeed accepts it
  steps         on that same bed: the built-in tiny nvme-opt workload with each
                of the three aio settings, `--rounds` rounds, the order rotated
                every round; the figure is the optimizer-step time per run and
                the defaults' time over each pick's, per round

Both tuners' wall times are end to end as a user waits for them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from sweep_vs_ds_nvme_tune import (  # noqa: E402
    VENV_BIN, LoadMeter, Recorder, describe, one_steps_run, run_ds_nvme_tune, say, spread)

from iotune.host.proc import prefer_interpreter_tools  # noqa: E402
from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS  # noqa: E402
from iotune.model.sweep import SweepPoint  # noqa: E402
from iotune.sweep.executor import Target  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.volumes.beds import BEDS, running_bed  # noqa: E402

LABELS = ("defaults", "ds_nvme_tune", "iotune")


def defaults_point() -> SweepPoint:
    d = DEEPSPEED_AIO_DEFAULTS
    return SweepPoint(d.block_size, d.queue_depth, d.intra_op_parallelism, d.single_submit, d.overlap_events)


def saved_outcome(path: Path) -> dict[str, Any]:
    """A saved `iotune sweep --json` outcome; waits while it is being written
    (a sweep running beside this benchmark writes it when it ends)."""
    while True:
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            say(f"waiting for {path}")
            time.sleep(30)


def run_iotune(bed: str, work: Path, saved: Path | None) -> dict[str, Any]:
    if saved is not None:
        outcome = saved_outcome(saved)
        return {"source": str(saved), "wall_s": None, "recommended": outcome["recommended"],
                "step_gain": outcome.get("step_gain"), "trials": outcome.get("trials")}
    argv = [str(VENV_BIN / "iotune"), "sweep", "--bed", bed, "--json", "-o", str(work / "iotune-journal")]
    say(f"iotune: {' '.join(argv)}")
    load, t0 = LoadMeter(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"iotune sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    outcome = json.loads(proc.stdout)
    say(f"iotune: {wall:.0f} s, pick {outcome['recommended']}, {(outcome.get('step_gain') or {}).get('sentence')}")
    return {"source": "run now", "argv": argv, "wall_s": wall, "recommended": outcome["recommended"],
            "step_gain": outcome.get("step_gain"), "trials": outcome.get("trials"), "outcome": outcome,
            "load": load.done()}


def fixed_aio_block(printed: dict[str, Any] | None) -> dict[str, Any] | None:
    """ds_nvme_tune's printed block as DeepSpeed accepts it."""
    if not printed:
        return None
    aio = dict(printed["aio_block"])
    fixed = {k: (v == "true" if v in ("true", "false") else v) for k, v in aio.items() if k != "num_threads"}
    if "num_threads" in aio:
        fixed["intra_op_parallelism"] = aio["num_threads"]
    return fixed


def three_way(target: Target, points: dict[str, SweepPoint], rounds: int, steps: int) -> dict[str, Any]:
    ex = StepsExecutor(steps=steps, size="tiny", strategy="nvme-opt")
    runs: list[dict[str, Any]] = []
    load, t0 = LoadMeter(), time.perf_counter()
    for i in range(rounds):
        order = list(LABELS[i % 3:] + LABELS[: i % 3])
        for label in order:
            runs.append(one_steps_run(ex, points[label], target, label, i))
    per_label = {lab: spread([r["optimizer_step_s"] for r in runs if r["label"] == lab and r.get("optimizer_step_s")])
                 for lab in LABELS}
    ratios: dict[str, list[float]] = {"ds_nvme_tune": [], "iotune": [], "iotune_over_ds_nvme_tune": []}
    for i in range(rounds):
        by = {r["label"]: r["optimizer_step_s"] for r in runs if r["pair"] == i and r.get("optimizer_step_s")}
        for lab in ("ds_nvme_tune", "iotune"):
            if lab in by and "defaults" in by:
                ratios[lab].append(by["defaults"] / by[lab])
        if "iotune" in by and "ds_nvme_tune" in by:
            ratios["iotune_over_ds_nvme_tune"].append(by["ds_nvme_tune"] / by["iotune"])
    return {"rounds": rounds, "steps": steps, "size": "tiny", "strategy": "nvme-opt",
            "points": {k: p.to_json() for k, p in points.items()}, "runs": runs,
            "optimizer_step_s": per_label,
            "speedup_over_defaults": {k: spread(v) for k, v in ratios.items() if k != "iotune_over_ds_nvme_tune"},
            "iotune_speedup_over_ds_nvme_tune": spread(ratios["iotune_over_ds_nvme_tune"]),
            "wall_s": time.perf_counter() - t0, "load": load.done()}


def run(args: argparse.Namespace, rec: Recorder, work: Path) -> None:
    rec.doc.update(benchmark="beds_vs_ds_nvme_tune", issue=9, bed=args.bed, bed_spec=BEDS[args.bed].to_json())
    iot: dict[str, Any] = {}
    if args.iotune_result is None:
        iot = run_iotune(args.bed, work, None)
        rec.phase("iotune", iot)
    with running_bed(args.bed) as bed:
        rec.doc["bed_instance"] = {"path": str(bed.path), "devices": [d.path for d in bed.devices],
                                   "cgroup": bed.cgroup, "overhead_us": bed.spec.to_json().get("overhead_us")}
        ds = run_ds_nvme_tune(work, bed.path / "ds", bed.cgroup, time.monotonic() + args.ds_budget_s, None, None)
        ds["fixed_aio_block"] = fixed_aio_block(ds.get("printed"))
        rec.phase("ds_nvme_tune", ds)
        subprocess.run(["rm", "-rf", str(bed.path / "ds")], check=False)
        if not ds["pick"]:
            raise SystemExit("ds_nvme_tune produced no pick; see the JSON's stdout/stderr tails")
        if not iot:
            iot = run_iotune(args.bed, work, args.iotune_result)
            rec.phase("iotune", iot)
        points = {"defaults": defaults_point(), "ds_nvme_tune": SweepPoint.from_json(ds["pick"]),
                  "iotune": SweepPoint.from_json(iot["recommended"])}
        say("three-way: " + "; ".join(f"{k}: {describe(p)}" for k, p in points.items()))
        target = Target(bed.path / "steps", cgroup=bed.cgroup)
        target.directory.mkdir()
        rec.phase("steps", three_way(target, points, args.rounds, args.steps))
    if iot["wall_s"] and ds["wall_s"]:
        rec.doc["wall_ratio_iotune_over_ds_nvme_tune"] = iot["wall_s"] / ds["wall_s"]
    rec.doc["complete"] = True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bed", required=True, choices=[b for b in BEDS if b != "builtin"])
    p.add_argument("--iotune-result", type=Path, help="a saved `iotune sweep --bed BED --json` outcome to reuse")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--ds-budget-s", type=float, default=3600.0, help="stop ds_nvme_tune after this long")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    args.budget_s, args.pilot = None, False
    prefer_interpreter_tools()      # ds_nvme_tune, its ds_io and the steps build ops with the venv's ninja, as iotune does
    if os.geteuid() != 0:
        print("error: run as root (loop devices, FUSE, blkio cgroups)", file=sys.stderr)
        return 2
    today = dt.date.today().isoformat()
    out = args.out or HERE / "results" / f"beds_vs_ds_nvme_tune-{args.bed}-{today}.json"
    rec = Recorder(out, args, time.monotonic())
    with tempfile.TemporaryDirectory(prefix="iotune-beds-") as tmp:
        try:
            run(args, rec, Path(tmp))
        except KeyboardInterrupt:
            rec.doc["interrupted"] = True
            return 130
        finally:
            rec.save()
            say(f"results: {out} ({rec.elapsed_s():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
