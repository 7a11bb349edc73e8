#!/usr/bin/env python3
"""Tracing overhead of `iotune trace`, as a throughput ratio (issue 2).

Run by hand, as root, from the repository root:

    sudo .venv/bin/python benchmarks/trace_overhead.py --rounds 5

What it measures
----------------
A 1 GiB loop device (``losetup --direct-io=on``) over a file in a temporary
directory is written once in full, so that reads do real I/O, and then read
by two fio workloads, each time-based (``--runtime``, default 5 s, after a
``--ramp-time`` of 1 s that fio leaves out of its numbers):

* ``randread-4k``:  4 KiB random reads, io_uring, iodepth 32, 2 jobs (max IOPS);
* ``seqread-512k``: 512 KiB sequential reads, io_uring, iodepth 8, 1 job.

Each workload runs under three conditions, back to back within a round, in an
order rotated from round to round:

* ``untraced``: plain fio;
* ``iotune``:   ``iotune trace --no-save --json --as-root -d loopN -- fio ...``
  (the probe is compiled and attached before fio starts);
* a reference bcc tool running in the background for the whole fio run
  (started, and waited for until it reports that it is tracing and at least
  ``--ref-wait`` seconds have passed, then stopped with SIGINT):
  ``biolatency-bpfcc`` where it works; on kernels without kprobes
  (CONFIG_KPROBES unset, biolatency 0.26 attaches only kprobes) it falls back
  to ``bitesize-bpfcc``, which uses the block_rq_issue tracepoint. The choice
  and the reason are printed and saved (``--reference`` overrides it).

Every run starts after the same idle time on the device (``--settle``,
default 5 s, counted from the end of the previous run; the reference tool's
start-up falls inside it, iotune's ~0.5 s probe compile comes on top): on the
development VM sequential reads are bimodal (~1 or 2-2.7 GB/s) and the fast
mode came more often after a pause, which the tracers' start-up would
otherwise hand them. It does not remove the bimodality.

fio writes its JSON to a file (``--output``) in every condition, and the
numbers come from ``jobs[0].read`` (``--group_reporting``). The overhead ratio
of a round is traced IOPS / untraced IOPS of that same round (with a fixed
block size the bandwidth ratio is the same). The table gives the median and
the spread (min-max and IQR) over rounds, next to the issue's targets (>= 0.99
for 4K random, >= 0.995 for 512K sequential). The verdict says "met" or
"missed" only when the whole IQR of the ratios lies on one side of the
target, "unresolved" when the run-to-run noise is larger than the margin, and
"invalid" when the whole IQR is above 1 (traced runs faster than untraced:
the measurement, not the tracer).

Finally the 4K random case runs once more under ``iotune trace --json``,
without ramp time, and iotune's JSON is checked: ``run.drops`` must all be 0
and the read requests iotune counted on the loop device must equal fio's
``total_ios``.

With ``--bpf-stats`` that run also turns on ``kernel.bpf_stats_enabled``
(restored afterwards) and records the CPU time iotune's two BPF programs
spent, per traced request. ``--rounds 0`` runs only this check.

Raw per-round numbers go to ``--out`` (default
``benchmarks/results/trace_overhead-<date>.json``).

Caveats
-------
The development VM has 2 cores, and the loop device sits on a virtio disk
(vda) with the host's page cache behind it: throughput varies by tens of per
cent from run to run, independently of tracing, hence the paired rounds and
medians. ``--dir /dev/shm`` puts the image on tmpfs instead (O_DIRECT works
there on kernels >= 6.6): no vda I/O, reads become memory copies, and the
measurement turns CPU-bound, which is the worst case for a tracer, free of
the host's disk noise (CPU contention still shows). Before and after each
round the script samples other processes' CPU use (``--max-background``),
waits up to ``--quiet-wait`` seconds for a quiet machine, and flags rounds
run under load. A single round's ratio means little; look at the median and the
spread, and run more rounds if the spread is wide. Both tracers see every
request twice (on the loop device and on vda, which serves it); iotune's
device filter drops the vda events after one hash lookup. fio's own CPU time
(usr/sys) is saved too, because on 2 cores the tracer's and fio's CPU compete.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

WORKLOADS: dict[str, dict[str, Any]] = {
    "randread-4k": {
        "fio": ["--rw=randread", "--bs=4k", "--iodepth=32", "--numjobs=2"],
        "target": 0.99,
    },
    "seqread-512k": {
        "fio": ["--rw=read", "--bs=512k", "--iodepth=8", "--numjobs=1"],
        "target": 0.995,
    },
}

REF_TOOLS = {
    "biolatency": ["biolatency-bpfcc"],
    "bitesize": ["bitesize-bpfcc"],
}


class BenchError(Exception):
    pass


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, **kw)


def output_of(argv: list[str]) -> str:
    return run(argv, capture_output=True, check=True).stdout.strip()


# ---------------------------------------------------------------- other load

def cpu_busy(sample_s: float = 1.0) -> float:
    """Share of all CPUs busy (not idle, not iowait) over `sample_s`, while
    this script runs nothing: the load other people put on the machine."""
    def snap() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v[:8]) - idle, sum(v[:8])
    b0, t0 = snap()
    time.sleep(sample_s)
    b1, t1 = snap()
    return (b1 - b0) / max(1, t1 - t0)


def wait_quiet(limit: float, max_wait: float) -> tuple[float, float]:
    """Wait (up to `max_wait` s) until the machine's background CPU load is
    below `limit`; returns (last measured load, seconds waited)."""
    t0 = time.monotonic()
    busy = cpu_busy()
    while busy > limit and time.monotonic() - t0 < max_wait:
        log(f"machine busy ({busy:.0%} CPU not ours), waiting...")
        time.sleep(4)
        busy = cpu_busy()
    return busy, time.monotonic() - t0


# ---------------------------------------------------------------- loop device

class LoopDevice:
    """A loop device over a file in a fresh temporary directory."""

    def __init__(self, size: str, parent: str | None) -> None:
        self.size = size
        self.parent = parent
        self.tmpdir: str | None = None
        self.dev: str | None = None

    def setup(self) -> str:
        self.tmpdir = tempfile.mkdtemp(prefix="iotune-bench-", dir=self.parent)
        img = os.path.join(self.tmpdir, "img")
        run(["truncate", "-s", self.size, img], check=True)
        self.dev = output_of(["losetup", "--direct-io=on", "-f", "--show", img])
        return self.dev

    @property
    def name(self) -> str:
        assert self.dev
        return os.path.basename(self.dev)

    def direct_io(self) -> bool:
        try:
            return Path(f"/sys/block/{self.name}/loop/dio").read_text().strip() == "1"
        except OSError:
            return False

    def cleanup(self) -> None:
        if self.dev:
            for attempt in range(10):
                if run(["losetup", "-d", self.dev], capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                log(f"warning: could not detach {self.dev}; run: losetup -d {self.dev}")
            self.dev = None
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


# ---------------------------------------------------------------- fio

def fio_argv(dev: str, workload: str, out: str, runtime: float, ramp: float) -> list[str]:
    argv = ["fio", f"--name={workload}", f"--filename={dev}", "--direct=1", "--ioengine=io_uring",
            *WORKLOADS[workload]["fio"], "--time_based", f"--runtime={runtime:g}",
            "--group_reporting", "--output-format=json", f"--output={out}"]
    if ramp > 0:
        argv.insert(-3, f"--ramp_time={ramp:g}")
    return argv


def parse_fio(path: str) -> dict[str, Any]:
    with open(path) as fh:
        doc = json.load(fh)
    job = doc["jobs"][0]
    rd = job["read"]
    return {
        "iops": rd["iops"],
        "bw_bytes": rd["bw_bytes"],
        "io_bytes": rd["io_bytes"],
        "total_ios": rd.get("total_ios"),
        "clat_mean_ns": rd.get("clat_ns", {}).get("mean"),
        "usr_cpu": job.get("usr_cpu"),
        "sys_cpu": job.get("sys_cpu"),
    }


def fill(dev: str) -> None:
    """Write the whole device once, so later reads hit allocated blocks."""
    run(["fio", "--name=fill", f"--filename={dev}", "--rw=write", "--bs=1m", "--direct=1",
         "--ioengine=io_uring", "--iodepth=8", "--output-format=terse"],
        stdout=subprocess.DEVNULL, check=True)


# ---------------------------------------------------------------- reference tool

class RefTool:
    """A bcc tool running in the background while fio runs."""

    def __init__(self, argv: list[str], min_wait: float, ready_timeout: float = 60.0) -> None:
        self.argv = argv
        self.min_wait = min_wait
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        t0 = time.monotonic()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert self.proc.stdout is not None
        seen = b""
        while b"Tracing" not in seen:
            left = self.ready_timeout - (time.monotonic() - t0)
            if left <= 0:
                self.stop()
                raise BenchError(f"{self.argv[0]} did not start tracing within {self.ready_timeout:g} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:   # EOF: the tool died
                    self.proc.wait()
                    tail = seen.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                    self.proc = None
                    raise BenchError(f"{self.argv[0]} exited before tracing: {tail[0]}")
                seen += chunk
        # the tool prints nothing more until SIGINT, so the pipe cannot fill up
        time.sleep(max(0.0, self.min_wait - (time.monotonic() - t0)))

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        self.proc = None


def choose_reference(wanted: str) -> tuple[str | None, list[str]]:
    """Pick the reference tool; returns (name, notes on what was tried)."""
    if wanted == "none":
        return None, ["reference tool disabled (--reference none)"]
    order = ["biolatency", "bitesize"] if wanted == "auto" else [wanted]
    notes = []
    for name in order:
        if shutil.which(REF_TOOLS[name][0]) is None:
            notes.append(f"{REF_TOOLS[name][0]}: not installed")
            continue
        tool = RefTool(REF_TOOLS[name], 0.0)
        try:
            tool.start()
        except BenchError as e:
            notes.append(str(e))
            continue
        tool.stop()
        notes.append(f"{REF_TOOLS[name][0]}: works, used as reference")
        return name, notes
    return None, notes


# ---------------------------------------------------------------- one measurement

def measure(cond: str, workload: str, loop: LoopDevice, args: argparse.Namespace, fio_out: str,
            ref: RefTool | None) -> dict[str, Any]:
    if os.path.exists(fio_out):
        os.unlink(fio_out)
    fio = fio_argv(loop.dev or "", workload, fio_out, args.runtime, args.ramp_time)
    t0 = time.monotonic()
    if cond == "untraced":
        idle = settle(args.settle)
        res = run(fio, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elif cond == "iotune":
        idle = settle(args.settle)
        res = run([args.iotune, "trace", "--no-save", "--json", "--as-root", "-d", loop.name, "--", *fio],
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    else:
        assert ref is not None
        ref.start()
        try:
            idle = settle(args.settle)
            res = run(fio, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            ref.stop()
    _IO_END[0] = time.monotonic()
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise BenchError(f"{cond}/{workload}: exit status {res.returncode}: {res.stderr.strip()[-500:]}")
    out = parse_fio(fio_out)
    out["wall_s"] = round(wall, 3)
    out["idle_before_s"] = round(idle, 2)
    return out


_IO_END = [0.0]   # when the previous measured command returned (monotonic)


def settle(seconds: float) -> float:
    """Sleep until `seconds` have passed since the previous run ended, so that
    every condition starts after the same idle time on the device (the host's
    virtio backend runs faster after a pause); returns the idle time. iotune's
    own probe compile (~0.5 s) comes on top of it."""
    left = seconds - (time.monotonic() - _IO_END[0])
    if left > 0:
        time.sleep(left)
    return time.monotonic() - _IO_END[0]


def lost_events_check(loop: LoopDevice, args: argparse.Namespace, fio_out: str) -> dict[str, Any]:
    """4K random once more under `iotune trace --json`, no ramp time: compare counts."""
    if os.path.exists(fio_out):
        os.unlink(fio_out)
    fio = fio_argv(loop.dev or "", "randread-4k", fio_out, args.runtime, 0)
    argv = [args.iotune, "trace", "--no-save", "--json", "--as-root", "-d", loop.name, "--", *fio]
    stats_was = enable_bpf_stats() if args.bpf_stats else None
    try:
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
            progs: list[dict[str, int]] = []
            while proc.poll() is None:
                if args.bpf_stats:   # the last sample before iotune detaches
                    progs = prog_stats(proc.pid) or progs
                time.sleep(0.2)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
    finally:
        if stats_was is not None:
            Path(BPF_STATS).write_text(stats_was)
    if proc.returncode != 0:
        raise BenchError(f"lost-events run: exit status {proc.returncode}: {stderr.strip()[-500:]}")
    doc = json.loads(stdout)
    fio_res = parse_fio(fio_out)
    rd: dict[str, Any] = {}
    for dev in doc["run"]["devices"]:
        if dev["name"] == loop.name:
            rd = dev["directions"].get("read", {})
    drops = doc["run"]["drops"]
    return {
        "command": ["iotune", *argv[1:]],
        "drops": drops,
        "all_drops_zero": all(v == 0 for v in drops.values()),
        "iotune_read_requests": rd.get("requests"),
        "iotune_read_completed": rd.get("completed"),
        "iotune_read_bytes": rd.get("bytes"),
        "fio_total_ios": fio_res["total_ios"],
        "fio_io_bytes": fio_res["io_bytes"],
        "fio_iops": fio_res["iops"],
        "requests_match": rd.get("requests") == fio_res["total_ios"],
        "bytes_match": rd.get("bytes") == fio_res["io_bytes"],
        "bcc_version": doc["run"]["host"].get("bcc_version"),
        "bpf_programs": progs or None,
        "bpf_ns_per_traced_request": (round(sum(p["run_time_ns"] for p in progs) / rd["requests"])
                                      if progs and rd.get("requests") else None),
    }


BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"


def enable_bpf_stats() -> str:
    """Turn on the kernel's per-program run-time accounting; returns the old value."""
    was = Path(BPF_STATS).read_text().strip()
    Path(BPF_STATS).write_text("1")
    return was


def prog_stats(pid: int) -> list[dict[str, int]]:
    """run_cnt / run_time_ns of the BPF programs process `pid` holds (fdinfo)."""
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            info = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                        if ":" in ln)
        except OSError:
            continue
        info = {k.strip(): v.strip() for k, v in info.items()}
        if "run_cnt" in info:
            found.append({"prog_id": int(info.get("prog_id", -1)), "run_cnt": int(info["run_cnt"]),
                          "run_time_ns": int(info["run_time_ns"])})
    return sorted(found, key=lambda p: p["prog_id"])


# ---------------------------------------------------------------- statistics and table

def spread(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "q1": q[0], "q3": q[2], "n": len(xs)}


def verdict(st: dict[str, Any], target: float) -> str:
    """'met' / 'missed' only when the whole IQR of the ratios is on one side of
    the target; otherwise the noise is too large to tell."""
    if st["q1"] > 1.0 and st["n"] >= 3:   # tracing cannot speed I/O up: biased or bimodal setup
        return "invalid (traced faster)"
    if st["q1"] >= target:
        return "met"
    if st["q3"] < target:
        return "missed"
    return "unresolved"


def summarize(rounds: list[dict[str, Any]], conds: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for w in WORKLOADS:
        rows = [r for r in rounds if r["workload"] == w and all(c in r["results"] for c in conds)]
        if not rows:
            continue
        s: dict[str, Any] = {"target": WORKLOADS[w]["target"], "rounds": len(rows),
                             "quiet_rounds": sum(1 for r in rows if r.get("quiet") is True),
                             "raw": {}, "ratio": {}}
        for c in conds:
            s["raw"][c] = {
                "iops": spread([r["results"][c]["iops"] for r in rows]),
                "mb_s": spread([r["results"][c]["bw_bytes"] / 1e6 for r in rows]),
            }
            if c != "untraced":
                ratios = [r["results"][c]["iops"] / r["results"]["untraced"]["iops"] for r in rows]
                st: dict[str, Any] = dict(spread(ratios))
                st["median_meets_target"] = st["median"] >= WORKLOADS[w]["target"]
                st["verdict"] = verdict(st, WORKLOADS[w]["target"])
                s["ratio"][c] = st
        summary[w] = s
    return summary


def table(summary: dict[str, Any], conds: list[str]) -> str:
    head = (f"{'workload':<13} {'condition':<11} {'IOPS median [min-max]':<27} {'MB/s median':>11}   "
            f"{'ratio median [min-max]':<24} {'IQR':<13} {'target':>6}  verdict (IQR vs target)")
    lines = [head, "-" * len(head)]
    for w, s in summary.items():
        for i, c in enumerate(conds):
            io, mb = s["raw"][c]["iops"], s["raw"][c]["mb_s"]
            line = (f"{w if i == 0 else '':<13} {c:<11} "
                    f"{io['median']:>9,.0f} [{io['min']:,.0f}-{io['max']:,.0f}]".ljust(53)
                    + f" {mb['median']:>11,.1f}   ")
            if c in s["ratio"]:
                r = s["ratio"][c]
                line += (f"{r['median']:.4f} [{r['min']:.4f}-{r['max']:.4f}]".ljust(24)
                         + f" {r['q1']:.3f}-{r['q3']:.3f}".ljust(14)
                         + f" {s['target']:>6}  {r['verdict']}")
            lines.append(line.rstrip())
        lines.append(f"{'':<13} ({s['rounds']} rounds, {s['quiet_rounds']} of them on a quiet machine)")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def machine_info(iotune: str) -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "kernel": os.uname().release,
        "fio": output_of(["fio", "--version"]),
        "iotune": output_of([iotune, "--version"]),
        "python": sys.version.split()[0],
        "source": source_state(),
    }


def source_state() -> dict[str, Any]:
    """Which iotune code was measured: HEAD, and local edits to the traced path."""
    git = ["git", "-C", str(REPO)]
    head = run([*git, "rev-parse", "HEAD"], capture_output=True)
    dirty = run([*git, "status", "--porcelain", "--", "iotune", "probes"], capture_output=True)
    return {"head": head.stdout.strip() or None,
            "uncommitted_in_iotune_or_probes": [ln[3:] for ln in dirty.stdout.splitlines()]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="paired rounds per workload (default 5)")
    p.add_argument("--runtime", type=float, default=5.0, help="fio runtime per run, seconds (default 5)")
    p.add_argument("--ramp-time", type=float, default=1.0,
                   help="fio ramp_time, left out of fio's numbers (default 1)")
    p.add_argument("--size", default="1G", help="loop device size (default 1G)")
    p.add_argument("--dir", default=None, help="where the image file goes (default: $TMPDIR or /tmp)")
    p.add_argument("--reference", choices=["auto", "biolatency", "bitesize", "none"], default="auto",
                   help="background bcc tool to compare with (default auto: biolatency, else bitesize)")
    p.add_argument("--ref-wait", type=float, default=3.0,
                   help="seconds to let the reference tool compile/attach before fio starts (default 3)")
    p.add_argument("--settle", type=float, default=5.0,
                   help="idle seconds on the device before every run, all conditions alike; the "
                        "reference tool's start-up counts towards it (default 5)")
    p.add_argument("--bpf-stats", action="store_true",
                   help="during the lost-events run, turn on kernel.bpf_stats_enabled (restored "
                        "afterwards) and record the CPU time of iotune's BPF programs per request")
    p.add_argument("--max-background", type=float, default=0.10,
                   help="CPU share (0-1) used by others above which the machine counts as busy; "
                        "each round waits for it to drop, and rounds that start or end busy are "
                        "flagged (default 0.10)")
    p.add_argument("--quiet-wait", type=float, default=300.0,
                   help="longest wait, seconds, for a quiet machine before a round (default 300)")
    p.add_argument("--iotune", default=str(Path(sys.executable).parent / "iotune"),
                   help="iotune executable (default: the one next to this Python)")
    p.add_argument("--out", type=Path,
                   default=REPO / "benchmarks" / "results" / f"trace_overhead-{dt.date.today().isoformat()}.json",
                   help="raw results JSON (default benchmarks/results/trace_overhead-<date>.json)")
    a = p.parse_args()
    if a.rounds < 0:
        p.error("--rounds must be >= 0 (0: only the lost-events check)")
    return a


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        log("needs root (BPF and loop devices): sudo .venv/bin/python benchmarks/trace_overhead.py")
        return 2
    if not os.access(args.iotune, os.X_OK):
        log(f"iotune not found at {args.iotune} (use --iotune)")
        return 2
    signal.signal(signal.SIGTERM, _sigterm)

    doc: dict[str, Any] = {
        "benchmark": "trace_overhead",
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(args.iotune),
        "params": {"rounds": args.rounds, "runtime_s": args.runtime, "ramp_time_s": args.ramp_time,
                   "size": args.size, "ref_wait_s": args.ref_wait,
                   "max_background": args.max_background, "settle_s": args.settle,
                   "workloads": {w: v["fio"] for w, v in WORKLOADS.items()}},
        "rounds": [],
        "complete": False,
    }
    loop = LoopDevice(args.size, args.dir)
    ref: RefTool | None = None
    conds = ["untraced", "iotune"]
    status = 1
    try:
        ref_name, notes = choose_reference(args.reference)
        for n in notes:
            log(f"reference: {n}")
        doc["reference"] = {"tool": REF_TOOLS[ref_name][0] if ref_name else None, "notes": notes}
        conds += [ref_name] if ref_name else []
        if ref_name:
            ref = RefTool(REF_TOOLS[ref_name], args.ref_wait)

        dev = loop.setup()
        doc["loop"] = {"device": dev, "backing_dir": loop.tmpdir, "direct_io": loop.direct_io()}
        if not doc["loop"]["direct_io"]:
            log(f"warning: {dev} is not in direct-I/O mode (is {loop.tmpdir} on tmpfs?)")
        tmp = loop.tmpdir
        assert tmp is not None
        fio_out = os.path.join(tmp, "fio.json")
        log(f"{dev} over {tmp}/img ({args.size}); writing it once in full...")
        fill(dev)
        log("warm-up (one untraced run per workload, not counted)...")
        for w in WORKLOADS if args.rounds else []:
            measure("untraced", w, loop, args, fio_out, None)

        for rnd in range(args.rounds):
            for wi, w in enumerate(WORKLOADS):
                busy_before, waited = wait_quiet(args.max_background, args.quiet_wait)
                k = (rnd + wi) % len(conds)
                order = conds[k:] + conds[:k]
                results = {}
                for c in order:
                    results[c] = measure(c, w, loop, args, fio_out, ref)
                    log(f"round {rnd + 1}/{args.rounds} {w:<13} {c:<11} "
                        f"{results[c]['iops']:>10,.0f} IOPS {results[c]['bw_bytes'] / 1e6:>8,.1f} MB/s")
                ratios = {c: results[c]["iops"] / results["untraced"]["iops"] for c in conds if c != "untraced"}
                log(f"round {rnd + 1}/{args.rounds} {w:<13} ratios: "
                    + ", ".join(f"{c} {v:.4f}" for c, v in ratios.items()))
                busy_after = cpu_busy()
                quiet = max(busy_before, busy_after) <= args.max_background
                if not quiet:
                    log(f"round {rnd + 1}/{args.rounds} {w:<13} other load on the machine: "
                        f"{busy_before:.0%} before, {busy_after:.0%} after")
                doc["rounds"].append({"round": rnd + 1, "workload": w, "order": order,
                                      "results": results, "ratios": ratios,
                                      "background_cpu_before": round(busy_before, 3),
                                      "background_cpu_after": round(busy_after, 3),
                                      "waited_for_quiet_s": round(waited, 1), "quiet": quiet})

        log("lost-events check (randread-4k under iotune trace --json, no ramp time)...")
        doc["lost_events"] = lost_events_check(loop, args, fio_out)
        doc["complete"] = True
        status = 0
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        status = 130
    except (BenchError, subprocess.CalledProcessError) as e:
        log(f"error: {e}")
        status = 1
    finally:
        if ref is not None:
            ref.stop()
        loop.cleanup()

    doc["summary"] = summarize(doc["rounds"], conds) if doc["rounds"] else {}
    doc["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")

    m = doc["machine"]
    print(f"\nTracing overhead: {m['nproc']} CPUs, kernel {m['kernel']}, {m['fio']}, {m['iotune']}; "
          f"{len(doc['rounds'])} workload-rounds, {args.runtime:g} s runs (+{args.ramp_time:g} s ramp)")
    print(f"reference tool: {doc.get('reference', {}).get('tool')}")
    print("ratio = traced IOPS / untraced IOPS of the same round\n")
    if doc["summary"]:
        print(table(doc["summary"], conds))
    le = doc.get("lost_events")
    if le:
        print(f"\nlost events (randread-4k under iotune): drops {le['drops']} -> "
              f"{'all zero' if le['all_drops_zero'] else 'NOT ZERO'}; "
              f"read requests on the loop device {le['iotune_read_requests']:,} "
              f"(completed {le['iotune_read_completed']:,}) vs fio total_ios {le['fio_total_ios']:,} -> "
              f"{'equal' if le['requests_match'] else 'DIFFERENT'}; bytes "
              f"{'equal' if le['bytes_match'] else 'DIFFERENT'}")
        if le.get("bpf_ns_per_traced_request"):
            print(f"iotune's BPF programs: {le['bpf_ns_per_traced_request']:,} ns of CPU per traced request "
                  f"(issue + complete, filtered-out events included; {le['bpf_programs']})")
    print(f"\nraw numbers: {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
