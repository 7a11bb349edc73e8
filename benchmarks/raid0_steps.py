"""RAID0 drive-count scaling with real DeepSpeed steps (issue 5).

Run by hand, as root, from the repository (results go to benchmarks/results/):

    sudo .venv/bin/python benchmarks/raid0_steps.py --counts 1,2,3 --rounds 3 --steps 8 --cap-mb-per-s 50

Reproduces the claim of "Does AI model offloading matter?" (xinnor.io blog) that RAID0 over 3 NVMe drives
cuts the step time of optimizer-state offload about 2x against one drive.
Three loop drives (direct I/O, sparse files) sit in one cgroup v1 blkio
cgroup that caps each at --cap-mb-per-s for reads and for writes (decimal
MB/s). For each drive count n, the first n drives get a fresh btrfs (raid0
data, raid1 metadata for n >= 2; n = 1 is btrfs too, so only the count
changes), mounted noatime,nodatacow by default (btrfs raid0 writes scale
only without copy-on-write at high rates; `--mount-options noatime` checks
that). The built-in workload (`iotune.workloads.train --strategy nvme-opt`,
optimizer state swapped to the volume) then runs inside the cgroup through
StepsExecutor, which reports the median step and optimizer-step time over
the steps after the first.

Rounds interleave the counts (1,2,3,1,2,3,...) so machine noise spreads over
all of them; each round also runs one uncapped 1-drive reference (the
compute-and-overhead floor). Each layout's raw ceiling is measured once with
fio (1 MiB, qd 16, 2 s after 0.5 s ramp). The JSON is rewritten after every
run, a failed run is recorded and the rounds go on, and every loop device,
mount and cgroup is removed on exit, error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.host.cgroup import Throttle, blkio_cgroup  # noqa: E402
from iotune.blockdev.devices import resolve_device  # noqa: E402
from iotune.errors import IotuneError  # noqa: E402
from iotune.model.sweep import SweepPoint  # noqa: E402
from iotune.sweep.executor import Target, TrialFailed  # noqa: E402
from iotune.sweep.fio_executor import FioExecutor  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.volumes.layout import LayoutSpec, build_layout  # noqa: E402

DEFAULT_MOUNT_OPTIONS = "noatime,nodatacow"
FIO_POINT = SweepPoint(block_size=1 << 20, queue_depth=16)
STEPS_POINT = SweepPoint()          # DeepSpeed's aio defaults: 1 MiB blocks, qd 8, 1 thread


def log(msg: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def sh(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


# --- drives and caps -------------------------------------------------------------------------------

@contextlib.contextmanager
def loop_drives(workdir: Path, count: int, size_bytes: int) -> Iterator[list[str]]:
    """`count` loop devices with direct I/O over sparse files; detached (and
    forgotten by btrfs) and the files removed on exit."""
    loops: list[str] = []
    try:
        for i in range(count):
            image = workdir / f"drive{i}.img"
            with image.open("xb") as fh:
                fh.truncate(size_bytes)
            loops.append(sh(["losetup", "--direct-io=on", "-f", "--show", str(image)]))
        yield loops
    finally:
        for loop in loops:
            subprocess.run(["btrfs", "device", "scan", "--forget", loop], capture_output=True)
            subprocess.run(["losetup", "-d", loop], capture_output=True)
            backing = Path("/sys/block") / Path(loop).name / "loop" / "backing_file"
            deadline = time.monotonic() + 5.0
            while backing.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        for i in range(count):
            (workdir / f"drive{i}.img").unlink(missing_ok=True)


def capped_cgroup(loops: list[str], bytes_per_s: int) -> contextlib.AbstractContextManager[Path]:
    """One blkio cgroup capping reads and writes on every drive to
    `bytes_per_s` each; stragglers moved out and the cgroup removed on exit."""
    caps = [Throttle(resolve_device(loop).number, read_bps=bytes_per_s, write_bps=bytes_per_s) for loop in loops]
    return blkio_cgroup("raid0-steps", caps)


def io_bytes(cg: Path, loops: list[str]) -> dict[str, dict[str, int]]:
    """Bytes read and written per drive by processes in `cg` so far."""
    nums = {resolve_device(loop).number: loop for loop in loops}
    out = {loop: {"read": 0, "write": 0} for loop in loops}
    for line in (cg / "blkio.throttle.io_service_bytes").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in nums and parts[1] in ("Read", "Write"):
            out[nums[parts[0]]][parts[1].lower()] = int(parts[2])
    return out


def io_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {d: {k: after[d][k] - before[d][k] for k in ("read", "write")} for d in after}


@contextlib.contextmanager
def volume(loops: list[str], mnt: Path, options: tuple[str, ...]) -> Iterator[Path]:
    """A fresh btrfs over `loops` (raid0 data for two or more), mounted."""
    spec = LayoutSpec(devices=tuple(loops), raid0=len(loops) > 1, fstype="btrfs", mount_options=options)
    with build_layout(spec, mnt, scratch=True) as vol:
        yield vol.path


# --- measurements ----------------------------------------------------------------------------------

def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores). Busy
    time minus the workload's own CPU time is what ran outside it during a
    run: other sessions' jobs, and kernel threads (loop workers, btrfs)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def fio_ceiling(loops: list[str], cg: Path, mnt: Path, options: tuple[str, ...]) -> dict[str, Any]:
    with volume(loops, mnt, options) as path:
        fio_dir = path / "fio"
        fio_dir.mkdir()
        target = Target(fio_dir, 64 << 20, 3, str(cg), runtime_s=2.0, ramp_s=0.5)
        try:
            m, _raw = FioExecutor(timeout_s=120).run(FIO_POINT, target)
        except TrialFailed as e:
            return {"drives": len(loops), "error": str(e)}
    return {"drives": len(loops), "read_bytes_per_s": m.read_bytes_per_s, "write_bytes_per_s": m.write_bytes_per_s,
            "read_lat_p50_us": m.read_lat_p50_us, "write_lat_p50_us": m.write_lat_p50_us}


def steps_run(loops: list[str], cg: Path | None, mnt: Path, options: tuple[str, ...],
              executor: StepsExecutor) -> dict[str, Any]:
    """One training run on a fresh volume; cg None runs it uncapped."""
    with volume(loops, mnt, options) as path:
        swap = path / "swap"
        swap.mkdir()
        io0 = io_bytes(cg, loops) if cg else None
        busy0, child0, t0 = cpu_busy_s(), children_cpu_s(), time.perf_counter()
        try:
            m, raw = executor.run(STEPS_POINT, Target(swap, cgroup=str(cg) if cg else None))
            result: dict[str, Any] = {"step_s": m.step_s, "optimizer_step_s": m.optimizer_step_s,
                                      "steps": raw["steps"]}
        except TrialFailed as e:
            result = {"error": str(e), "raw": e.raw}
        wall = time.perf_counter() - t0
        busy, child = cpu_busy_s() - busy0, children_cpu_s() - child0
        result.update(wall_s=wall, workload_cpu_s=child, outside_cpu_cores=max(0.0, busy - child) / wall,
                      loadavg=Path("/proc/loadavg").read_text().split()[:3])
        if cg and io0 is not None:
            result["io_bytes"] = io_delta(io0, io_bytes(cg, loops))
    return result


# --- summary ---------------------------------------------------------------------------------------

def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    ok = [r for r in runs if "step_s" in r]
    out: dict[str, Any] = {}
    for label, pick in [(str(n), lambda r, n=n: r["capped"] and r["drives"] == n) for n in counts] + \
                       [("uncapped-1", lambda r: not r["capped"])]:
        sel = [r for r in ok if pick(r)]
        if sel:
            out[label] = {k: spread([r[k] for r in sel]) for k in ("step_s", "optimizer_step_s")}
    ratios: dict[str, Any] = {}
    for n in counts[1:]:
        if "1" not in out or str(n) not in out:
            continue
        entry = {}
        for k in ("step_s", "optimizer_step_s"):
            per_round = [a[k] / b[k] for a, b in _pairs(ok, 1, n)]
            entry[k] = {"of_medians": out["1"][k]["median"] / out[str(n)][k]["median"],
                        "per_round": spread(per_round) if per_round else None}
        ratios[f"1/{n}"] = entry
    out["ratios"] = ratios
    return out


def _pairs(ok: list[dict[str, Any]], a: int, b: int) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Capped runs with `a` and `b` drives from the same round."""
    by = {(r["round"], r["drives"]): r for r in ok if r["capped"]}
    for rnd in sorted({r["round"] for r in ok}):
        if (rnd, a) in by and (rnd, b) in by:
            yield by[(rnd, a)], by[(rnd, b)]


def print_table(summary: dict[str, Any], fio: list[dict[str, Any]]) -> None:
    ceil = {f["drives"]: f for f in fio if "read_bytes_per_s" in f}
    print("drives  fio read MB/s  fio write MB/s  optimizer step s (median, range)  step s (median, range)")
    for label, s in summary.items():
        if label == "ratios":
            continue
        n = int(label.split("-")[-1])
        f = ceil.get(n) if label[0].isdigit() else None
        rd = f"{f['read_bytes_per_s'] / 1e6:13.0f}" if f else f"{'-':>13}"
        wr = f"{f['write_bytes_per_s'] / 1e6:14.0f}" if f else f"{'-':>14}"
        o, t = s["optimizer_step_s"], s["step_s"]
        print(f"{label:>10}  {rd}  {wr}  {o['median']:6.2f} ({o['min']:.2f}-{o['max']:.2f}) n={o['n']}"
              f"            {t['median']:6.2f} ({t['min']:.2f}-{t['max']:.2f})")
    for key, r in summary["ratios"].items():
        parts = []
        for k in ("optimizer_step_s", "step_s"):
            pr = r[k]["per_round"]
            rng = f" (rounds {pr['min']:.2f}-{pr['max']:.2f})" if pr else ""
            parts.append(f"{k} {r[k]['of_medians']:.2f}x{rng}")
        print(f"ratio {key} drives: " + ", ".join(parts))


# --- main ------------------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"kernel": sh(["uname", "-r"]), "cpus": os.cpu_count(), "cpu_model": cpu, "commit": commit,
            "deepspeed": metadata.version("deepspeed"), "torch": metadata.version("torch"),
            "fio": sh(["fio", "--version"]), "btrfs_progs": sh(["mkfs.btrfs", "--version"]).splitlines()[0]}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,2,3", help="drive counts, interleaved in this order every round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per run (the first is left out)")
    ap.add_argument("--size", default="small", help="model size preset (small: 13.7 M parameters)")
    ap.add_argument("--cap-mb-per-s", type=float, default=50.0, help="per-drive read and write cap, decimal MB/s")
    ap.add_argument("--drive-gib", type=float, default=2.0)
    ap.add_argument("--mount-options", default=DEFAULT_MOUNT_OPTIONS,
                    help="btrfs mount options (drop nodatacow to see copy-on-write writes)")
    ap.add_argument("--no-reference", action="store_true", help="skip the uncapped 1-drive run of each round")
    ap.add_argument("--dir", type=Path, default=None, help="where the drive images go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                    f"raid0_steps-{dt.date.today().isoformat()}.json")
    return ap.parse_args()


def save(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


def run_all(args: argparse.Namespace, doc: dict[str, Any], work: Path, counts: list[int]) -> None:
    cap = int(args.cap_mb_per_s * 1e6)
    executor = StepsExecutor(steps=args.steps, size=args.size, timeout_s=900)
    mnt = work / "mnt"
    options = tuple(args.mount_options.split(","))
    with loop_drives(work, max(counts), int(args.drive_gib * (1 << 30))) as loops, \
            capped_cgroup(loops, cap) as cg:
        doc["drives"] = loops
        for n in counts:
            doc["fio"].append(fio_ceiling(loops[:n], cg, mnt, options))
            log(f"fio {n} drive(s): {json.dumps(doc['fio'][-1])}")
            save(doc, args.out)
        for rnd in range(args.rounds):
            plan = [(n, True) for n in counts] + ([] if args.no_reference else [(1, False)])
            for n, capped in plan:
                r = steps_run(loops[:n], cg if capped else None, mnt, options, executor)
                doc["runs"].append({"round": rnd, "drives": n, "capped": capped, **r})
                log(f"round {rnd} drives {n} {'capped' if capped else 'uncapped'}: step "
                    f"{r.get('step_s')} opt {r.get('optimizer_step_s')} wall {r['wall_s']:.0f}s "
                    f"outside {r['outside_cpu_cores']:.2f} cores {r.get('error', '')}")
                doc["summary"] = summarize(doc["runs"], counts)
                save(doc, args.out)


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        sys.stderr.write("error: needs root (losetup, mkfs, mount, cgroups): run with sudo\n")
        return 1
    counts = [int(c) for c in args.counts.split(",")]
    doc: dict[str, Any] = {
        "benchmark": "raid0_steps", "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "machine": machine(), "command": sys.argv,
        "parameters": {"counts": counts, "rounds": args.rounds, "steps": args.steps, "size": args.size,
                       "strategy": "nvme-opt", "cap_bytes_per_s_per_drive": int(args.cap_mb_per_s * 1e6),
                       "drive_bytes": int(args.drive_gib * (1 << 30)), "filesystem": "btrfs",
                       "mkfs_profile": "-d raid0 -m raid1 (n >= 2); defaults (n = 1)",
                       "mount_options": args.mount_options.split(","), "aio": STEPS_POINT.to_json(),
                       "fio": {"point": FIO_POINT.to_json(), "runtime_s": 2.0, "ramp_s": 0.5}},
        "fio": [], "runs": [], "summary": {}}
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="iotune-raid0-", dir=args.dir))
    try:
        run_all(args, doc, work, counts)
    except KeyboardInterrupt:
        log("interrupted: cleaned up; partial results kept")
        doc["interrupted"] = True
    except IotuneError as e:
        log(f"error: {e}")
        doc["error"] = str(e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        doc["wall_s"] = time.perf_counter() - started
        save(doc, args.out)
    if doc["summary"]:
        print_table(doc["summary"], doc["fio"])
    print(f"wrote {args.out}")
    return 0 if "error" not in doc and not doc.get("interrupted") else 1


if __name__ == "__main__":
    sys.exit(main())
