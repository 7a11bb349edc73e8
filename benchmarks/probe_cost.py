#!/usr/bin/env python3
"""Probe cost per event (issue 12): iotune's block probe, its application
probe (`trace --app`) and libbpf-tools' `biolatency`, on the same fio
workloads in the same run, measured by the kernel itself.

Run by hand, as root, from the repository root:

    sudo .venv/bin/python benchmarks/probe_cost.py --rounds 3

`kernel.bpf_stats_enabled=1` (restored afterwards) makes the kernel account
every BPF program's run count and run time; each tracer's programs are read
from its own file descriptors (/proc/PID/fdinfo: run_cnt, run_time_ns) just
before it detaches, and named with `bpftool prog show id N`. Per-event cost
of a program = run_time_ns / run_cnt; per request = all of a tracer's run
time / the requests fio issued (fio's total_ios: one block request per I/O on
a loop device, and one io_uring submission and completion each).

Conditions, per workload, in an order rotated every round:
  untraced        fio alone
  biolatency      libbpf-tools biolatency -d LOOP in the background (issue +
                  complete tracepoints; the reference of the issue)
  biolatency -Q   the same with queue time (adds block_rq_insert), as
                  iotune's block probe now measures it
  iotune          `iotune trace --no-save --json --as-root -d LOOP -- fio ...`
  iotune --app    the same with the application probe (`--app`) as well

Workloads (fio, io_uring, direct I/O, on a loop device over a file in --dir,
default /dev/shm: reads are memory copies, the measurement is CPU-bound, the
worst case for a tracer): randread-4k (iodepth 32, 2 jobs) and seqread-512k
(iodepth 8, 1 job). The throughput ratio traced/untraced is reported too.

Results: --out (default benchmarks/results/probe_cost-<date>.json) and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from trace_overhead import (  # noqa: E402
    BPF_STATS, enable_bpf_stats, fio_argv, parse_fio, prog_stats)

from iotune.volumes.parts import attach_loop, create_file  # noqa: E402

BIOLATENCY = "/usr/sbin/biolatency"     # Debian's libbpf-tools
CONDITIONS = ("untraced", "biolatency", "biolatency -Q", "iotune", "iotune --app")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_NAMES: dict[int, str] = {}


def prog_names(ids: list[int]) -> dict[int, str]:
    """bpftool's name for each program id; asked while the tracer still holds
    them (an id is gone once its program is unloaded), and remembered."""
    out = {}
    for i in ids:
        if _NAMES.get(i, "?") != "?":
            out[i] = _NAMES[i]
            continue
        try:
            doc = json.loads(subprocess.run(["bpftool", "prog", "show", "id", str(i), "--json"],
                                            capture_output=True, text=True, check=True).stdout)
            out[i] = doc.get("name", "?")
        except (OSError, subprocess.CalledProcessError, json.JSONDecodeError):
            out[i] = "?"
        _NAMES[i] = out[i]
    return out


def sample_until_exit(proc: subprocess.Popen[str], pid: int | None = None) -> list[dict[str, int]]:
    """The last per-program sample of `pid` (default proc's) before proc ends."""
    progs: list[dict[str, int]] = []
    while proc.poll() is None:
        progs = prog_stats(pid or proc.pid) or progs
        prog_names([p["prog_id"] for p in progs])
        time.sleep(0.1)
    return progs


def one_run(condition: str, loop: str, workload: str, runtime: float, iotune: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fio.json")
        fio = fio_argv(f"/dev/{loop}", workload, out, runtime, 1.0)
        progs: list[dict[str, int]] = []
        if condition == "untraced":
            subprocess.run(fio, check=True, capture_output=True)
        elif condition.startswith("biolatency"):
            argv = [BIOLATENCY, "-d", loop] + (["-Q"] if condition.endswith("-Q") else [])
            tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(2.0)                                  # attached well before fio starts
            if tracer.poll() is not None:
                raise SystemExit(f"{argv}: exited early: {tracer.stderr.read() if tracer.stderr else ''}")
            job = subprocess.Popen(fio, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
            while job.poll() is None:
                progs = prog_stats(tracer.pid) or progs
                prog_names([p["prog_id"] for p in progs])
                time.sleep(0.1)
            progs = prog_stats(tracer.pid) or progs
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
        else:
            argv = [iotune, "trace", "--no-save", "--json", "--as-root", "-d", loop,
                    *(["--app"] if condition.endswith("--app") else []), "--", *fio]
            tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
            progs = sample_until_exit(tracer)
            if tracer.returncode != 0:
                raise SystemExit(f"{' '.join(argv)}: exit {tracer.returncode}")
        res = parse_fio(out)
    names = prog_names([p["prog_id"] for p in progs])
    programs = [{"name": names[p["prog_id"]], **p,
                 "ns_per_run": round(p["run_time_ns"] / p["run_cnt"], 1) if p["run_cnt"] else None}
                for p in progs]
    total_ns = sum(p["run_time_ns"] for p in progs)
    return {"condition": condition, "workload": workload, "fio": res, "programs": programs,
            "bpf_ns_total": total_ns,
            "bpf_ns_per_request": round(total_ns / res["total_ios"], 1) if progs and res["total_ios"] else None}


def med(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runtime", type=float, default=5.0)
    p.add_argument("--dir", default="/dev/shm")
    p.add_argument("--size", type=int, default=1 << 30)
    p.add_argument("--iotune", default=str(Path(sys.executable).parent / "iotune"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (BPF, loop devices, kernel.bpf_stats_enabled)")
    for tool in (BIOLATENCY, "bpftool", "fio"):
        if not (Path(tool).exists() or subprocess.run(["which", tool], capture_output=True).returncode == 0):
            raise SystemExit(f"{tool} is missing: apt-get install libbpf-tools bpftool fio")
    out = args.out or HERE / "results" / f"probe_cost-{dt.date.today()}.json"
    doc: dict[str, Any] = {"benchmark": "probe_cost", "issue": 12, "argv": sys.argv,
                           "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                           "kernel": os.uname().release, "cpus": os.cpu_count(), "runs": []}
    was = enable_bpf_stats()
    try:
        with contextlib.ExitStack() as stack:
            image = Path(tempfile.mkdtemp(dir=args.dir)) / "drive.img"
            stack.callback(image.parent.rmdir)
            create_file(stack, image, args.size)
            loop = attach_loop(stack, image).name
            subprocess.run(["dd", "if=/dev/zero", f"of=/dev/{loop}", "bs=1M", f"count={args.size >> 20}",
                            "oflag=direct", "status=none"], check=True)
            for r in range(args.rounds):
                for w in ("randread-4k", "seqread-512k"):
                    order = CONDITIONS[r % len(CONDITIONS):] + CONDITIONS[:r % len(CONDITIONS)]
                    for c in order:
                        res = one_run(c, loop, w, args.runtime, args.iotune)
                        res["round"] = r
                        doc["runs"].append(res)
                        log(f"round {r} {w:13} {c:14} {res['fio']['iops']:>10.0f} IOPS  "
                            f"{res['bpf_ns_per_request'] or '-':>8} BPF ns/request")
                        out.write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        Path(BPF_STATS).write_text(was)
    summary: dict[str, Any] = {}
    for w in ("randread-4k", "seqread-512k"):
        base = {x["round"]: x["fio"]["iops"] for x in doc["runs"] if x["workload"] == w and x["condition"] == "untraced"}
        for c in CONDITIONS[1:]:
            runs = [x for x in doc["runs"] if x["workload"] == w and x["condition"] == c]
            per_prog: dict[str, list[float]] = {}
            for x in runs:
                for prog in x["programs"]:
                    if prog["ns_per_run"] is not None and prog["run_cnt"] > 100:
                        per_prog.setdefault(prog["name"], []).append(prog["ns_per_run"])
            summary[f"{w} {c}"] = {
                "bpf_ns_per_request": med([x["bpf_ns_per_request"] for x in runs if x["bpf_ns_per_request"]]),
                "ns_per_run_by_program": {k: med(v) for k, v in per_prog.items()},
                "iops_ratio": med([x["fio"]["iops"] / base[x["round"]] for x in runs if base.get(x["round"])]),
            }
    doc["summary"] = summary
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'workload / tracer':<32} {'BPF ns/request':>16} {'IOPS ratio':>12}   per program ns/run (median)")
    for k, v in summary.items():
        progs = ", ".join(f"{n} {m['median']:.0f}" for n, m in v["ns_per_run_by_program"].items())
        print(f"{k:<32} {v['bpf_ns_per_request']['median']:>16.0f} {v['iops_ratio']['median']:>12.3f}   {progs}")
    log(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
