"""Checkpoint save and load: DeepSpeed's defaults against the checkpoint
sweep's pick, on real save_checkpoint and load_checkpoint calls of the
built-in workload with its optimizer on NVMe.

Run by hand, as root, from the repository (results go to benchmarks/results/):

    sudo .venv/bin/python benchmarks/checkpoints.py --model wide --rounds 3
    sudo .venv/bin/python benchmarks/checkpoints.py --model 1b --rounds 3   # alone on the machine: ~15 GB of RAM

Beds, each a loop drive over a file on the VM's disk with ext4 on it, the
swap directory and the checkpoint directory both on it:
- capped: the drive in a blkio cgroup capping reads and writes at
  --cap-mb-per-s (decimal MB/s; the trials' processes join it). cgroup v1
  charges buffered writes to the flusher, not to the job, so the checkpoint's
  writeback is not capped; its reads and DeepSpeed's O_DIRECT swap I/O are;
- loop: the same drive without a cap.

Per bed: the drive's write ceiling (fio, 1 MiB direct writes at qd 16,
through the bed's cgroup); the checkpoint sweep (iotune.sweep.checkpoint.sweep:
the python and fast writers, a 32 MiB writeback dirty limit; --repeats
trials each, medians) picks a candidate; then DeepSpeed's defaults
and the pick run side by side, --rounds rounds, the order alternating: save
seconds, load seconds, the bytes not yet durable when save_checkpoint
returned, and whether the checkpoint restored (the next step's loss after a
load in a fresh process equal to the uninterrupted run's). Medians.

Targets (docs/benchmarks.md): the pick saves at least 2x faster than the
defaults on at least one bed and is never slower; the whole save reaches at
least 80 % of the drive's measured write ceiling counting durable bytes only
((file bytes - bytes still dirty at return) / save seconds); every pick
restores. The JSON is rewritten after every run; drives, mounts and cgroups
go on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.model.checkpoint import WriterSettings  # noqa: E402
from iotune.model.checkpoint_sweep import DEFAULTS, CheckpointCandidate, CheckpointRequest, CheckpointTrial  # noqa: E402
from iotune.sweep.checkpoint.sweep import run_checkpoint_sweep  # noqa: E402
from iotune.sweep.checkpoint.trial import run_trial  # noqa: E402
from iotune.volumes.scratch import scratch_drive  # noqa: E402

MiB = 1 << 20
WRITERS = (WriterSettings("python"), WriterSettings("fast"))
DIRTY_LIMITS = (32 * MiB,)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_ceiling(path: Path, cgroup: str | None) -> float:
    """fio: 1 MiB O_DIRECT writes at qd 16 for 4 s (after 1 s of ramp), bytes/s."""
    argv = ["fio", "--name=ceiling", f"--filename={path / 'fio-ceiling'}", "--rw=write", "--bs=1M",
            "--iodepth=16", "--ioengine=libaio", "--direct=1", "--size=1G", "--time_based", "--runtime=4",
            "--ramp_time=1", "--output-format=json"]
    if cgroup:
        argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "fio", *argv]
    try:
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    finally:
        (path / "fio-ceiling").unlink(missing_ok=True)
    job = json.loads(out)["jobs"][0]["write"]
    return float(job["io_bytes"]) / (job["runtime"] / 1000)


def figures(t: CheckpointTrial) -> dict[str, Any]:
    durable = None
    if t.save_s and t.not_durable_bytes is not None:
        durable = (t.file_bytes - t.not_durable_bytes) / t.save_s
    return {"status": t.status, "error": t.error, "save_s": t.save_s, "file_bytes": t.file_bytes,
            "not_durable_bytes": t.not_durable_bytes, "durable_bytes_per_s": durable,
            "load_s": t.restore.load_s if t.restore else None,
            "restored": bool(t.restore and t.restore.restored), "restore_reason": t.restore.reason if t.restore else "",
            "part_s": t.part_s, "steps_after_s": list(t.steps_after_s)}


def med(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def run_bed(name: str, args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    cap = int(args.cap_mb_per_s * 1e6) if name == "capped" else 0
    with scratch_drive(args.dir, args.drive_gib << 30, cap, fstype="ext4") as drive:
        assert drive.mount_point is not None
        cgroup = str(drive.cgroup) if drive.cgroup else ""
        bed: dict[str, Any] = {"cap_bytes_per_s": cap or None, "device": drive.device.name}
        out["beds"][name] = bed
        bed["write_ceiling_bytes_per_s"] = write_ceiling(drive.mount_point, cgroup or None)
        say(f"{name}: write ceiling {bed['write_ceiling_bytes_per_s'] / 1e6:.1f} MB/s")
        base = dict(swap_dir=str(drive.mount_point), preset=args.model, save_at=args.save_at,
                    measure_steps=args.measure_steps, interval_steps=args.interval, cgroup=cgroup,
                    precision=args.precision, timeout_s=args.timeout)
        sweep = run_checkpoint_sweep(CheckpointRequest(out_dir=str(args.work / f"sweep-{name}"), writers=WRITERS,
                                                       dirty_limits=DIRTY_LIMITS, repeats=args.repeats, **base), say)
        pick = sweep.best.candidate if sweep.best else DEFAULTS
        bed["sweep"] = {"pick": pick.to_json(), "pick_label": pick.label(),
                        "results": [r.to_json() for r in sweep.results], "aio": sweep.aio_statement,
                        "notes": list(sweep.notes)}
        save()
        side_by_side(name, bed, CheckpointRequest(out_dir=str(args.work / f"rounds-{name}"), **base), pick, args,
                     save)


def side_by_side(name: str, bed: dict[str, Any], req: CheckpointRequest, pick: CheckpointCandidate,
                 args: argparse.Namespace, save: Any) -> None:
    runs: dict[str, list[dict[str, Any]]] = {"defaults": [], "pick": []}
    bed["runs"] = runs
    for r in range(args.rounds):
        order = [("defaults", DEFAULTS), ("pick", pick)]
        for label, candidate in order if r % 2 == 0 else reversed(order):
            say(f"{name}: round {r + 1}/{args.rounds}: {label} ({candidate.label()})")
            runs[label].append(figures(run_trial(req, candidate, r)))
            save()
    ceiling = bed["write_ceiling_bytes_per_s"]
    summary = {}
    for label, rows in runs.items():
        durable = med(rows, "durable_bytes_per_s")
        summary[label] = {"save_s": med(rows, "save_s"), "load_s": med(rows, "load_s"),
                          "not_durable_bytes": med(rows, "not_durable_bytes"), "durable_bytes_per_s": durable,
                          "durable_share_of_ceiling": durable / ceiling if durable and ceiling else None,
                          "restored": all(x["restored"] for x in rows)}
    d, p = summary["defaults"]["save_s"], summary["pick"]["save_s"]
    summary["save_speedup"] = d / p if d and p else None
    bed["summary"] = summary
    save()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="wide", help="the built-in workload's preset (wide; 1b needs ~15 GB of RAM)")
    p.add_argument("--beds", default="capped,loop")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="the sweep's repeats per candidate (medians)")
    p.add_argument("--cap-mb-per-s", type=float, default=200.0)
    p.add_argument("--drive-gib", type=int, default=8)
    p.add_argument("--save-at", type=int, default=2)
    p.add_argument("--measure-steps", type=int, default=2)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where the drives' image files go")
    args = p.parse_args()
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    args.work = Path(f"/var/tmp/iotune-bench-checkpoints-{stamp}")
    result = ROOT / "benchmarks" / "results" / f"checkpoints-{args.model}-{stamp}.json"
    out: dict[str, Any] = {"model": args.model, "started_at": stamp, "args": {k: str(v) for k, v in vars(args).items()},
                           "beds": {}}

    def save() -> None:
        result.write_text(json.dumps(out, indent=1) + "\n")

    for name in args.beds.split(","):
        run_bed(name, args, out, save)
    save()
    say(f"results in {result}")
    return 0


if __name__ == "__main__":
    # SIGTERM (and SIGINT, which a background job ignores) unwinds: drives, mounts and cgroups go
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
