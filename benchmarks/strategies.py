"""Offload strategies side by side, and the cost of iotune's attribution hook.

Run by hand, as root, from the repository (results go to benchmarks/results/):

    sudo .venv/bin/python benchmarks/strategies.py --sizes tiny,small --steps 12 --pairs 3

For each size and strategy it runs the built-in workload under
`iotune trace` on a scratch loop drive (ext4, direct I/O, uncapped), and
records median step time, optimizer-step time and block GB per step. For
nvme-opt it also measures the attribution hook's overhead: traced with the
hook vs traced with --no-inject, alternating, `--pairs` times; the ratio is
hook / no-hook step time per pair (target <= 1.02), reported as median and
range. Caveats: a 2-core VM, so step times move with anything else running;
the CPU accelerator stands in for a GPU, so absolute times say little and the
ratios and byte counts are what to read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.analysis.attribution import median_step, step_breakdowns  # noqa: E402
from iotune.model.runfile import load_run  # noqa: E402

STRATEGIES = ("baseline", "cpu", "nvme-opt", "nvme-all", "zenflow")


def sh(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def make_drive(workdir: Path) -> tuple[str, Path]:
    img = workdir / "drive.img"
    with img.open("wb") as fh:
        fh.truncate(4 << 30)
    loop = sh(["losetup", "--direct-io=on", "-f", "--show", str(img)])
    sh(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", loop])
    mnt = workdir / "mnt"
    mnt.mkdir()
    sh(["mount", "-o", "noatime", loop, str(mnt)])
    return loop, mnt


def traced_steps(loop: str, mnt: Path, size: str, strategy: str, steps: int, inject: bool, out: Path) -> dict:
    swap = mnt / f"{strategy}-{size}"
    swap.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "iotune", "trace", "--json", "-o", str(out), "-d", loop.split("/")[-1]]
    if not inject:
        argv.append("--no-inject")
    argv += ["--", sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", strategy,
             "--size", size, "--steps", str(steps)]
    if strategy in ("nvme-opt", "nvme-all"):
        argv += ["--nvme-path", str(swap)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    records = [json.loads(line.split(" ", 1)[1]) for line in proc.stderr.splitlines()
               if line.startswith("IOTUNE_STEP ")]
    steady = records[1:]
    result = {"step_s": statistics.median(r["step_s"] for r in steady),
              "optimizer_step_s": statistics.median(r["optimizer_step_s"] for r in steady),
              "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"]}
    run = load_run(out)
    med = median_step(step_breakdowns(run))
    if med is not None:
        result.update(block_read_gb_per_step=med.read_bytes / 1e9, block_write_gb_per_step=med.write_bytes / 1e9,
                      swap_gb_per_step=(med.swap_read_bytes + med.swap_write_bytes) / 1e9)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated; empty: none")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                    f"strategies-{dt.date.today().isoformat()}.json")
    args = ap.parse_args()
    doc: dict = {"benchmark": "strategies", "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                 "kernel": sh(["uname", "-r"]), "steps": args.steps, "results": [], "injection": []}
    with tempfile.TemporaryDirectory(prefix="iotune-bench-") as tmp:
        work = Path(tmp)
        loop, mnt = make_drive(work)
        try:
            for size in args.sizes.split(","):
                for strategy in [x for x in args.strategies.split(",") if x]:
                    r = traced_steps(loop, mnt, size, strategy, args.steps, True, work / f"run-{size}-{strategy}")
                    doc["results"].append({"size": size, "strategy": strategy, **r})
                    print(json.dumps(doc["results"][-1]), flush=True)
                for pair in range(args.pairs):
                    # alternate which runs first, so drift on a shared machine cancels out
                    order = (True, False) if pair % 2 == 0 else (False, True)
                    got = {inj: traced_steps(loop, mnt, size, "nvme-opt", args.steps, inj,
                                             work / f"{'on' if inj else 'off'}-{size}-{pair}") for inj in order}
                    on, off = got[True], got[False]
                    ratio = on["step_s"] / off["step_s"] if "step_s" in on and "step_s" in off else None
                    doc["injection"].append({"size": size, "pair": pair, "with_hook_step_s": on.get("step_s"),
                                             "without_hook_step_s": off.get("step_s"), "ratio": ratio})
                    print(json.dumps(doc["injection"][-1]), flush=True)
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
            subprocess.run(["losetup", "-d", loop], check=False)
    for size in args.sizes.split(","):
        ratios = [x["ratio"] for x in doc["injection"] if x["size"] == size and x["ratio"]]
        if ratios:
            print(f"{size}: hook/no-hook step time median {statistics.median(ratios):.3f} "
                  f"(range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} pairs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
