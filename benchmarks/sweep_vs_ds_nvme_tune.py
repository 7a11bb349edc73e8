"""iotune sweep vs DeepSpeed's ds_nvme_tune on one emulated drive (issue 4).

Run by hand, as root, from the repository (results go to benchmarks/results/):

    .venv/bin/python benchmarks/sweep_vs_ds_nvme_tune.py [--budget-s 2400] [--aio]

Everything runs in one process on ONE emulated drive with iotune's built-in
limits (iotune.sweep.target.BUILTIN_LIMITS: 200 MB/s and 800 IOPS caps,
4 ms per request, 8 at once), ext4 on it, every measured process inside the
drive's blkio cgroup. Phases, in this order:

  iotune-fio   the default profile's adaptive search, fio executor, time-based
               trials, confirm_top=0 (one search over a fresh journal)
  grid         the reference: profile ds-nvme-tune-grid run exhaustively with
               the same executor (overlap_events, which fio cannot express, is
               collapsed to one value: the other half would rerun identical fio jobs)
  closed-loop  optimizer-step time of the built-in nvme-opt workload (tiny),
               iotune's pick vs DeepSpeed's default aio settings, alternating pairs
  ds_nvme_tune DeepSpeed's tuner with its default grid, in its own process group
               inside the cgroup, until it ends or the budget says stop (then
               its completed ds_io logs are used and the result is marked partial)
  picks        the grid's best, iotune's pick and ds_nvme_tune's pick, measured
               again with the fio executor, `--pick-repeats` rounds, order rotated
  iotune-aio   (--aio, only if the budget allows) the adaptive search with
               DeepSpeed's own aio engine

Raw numbers are written to the JSON after every phase, so an interrupted run
(Ctrl-C, budget) keeps what it has. Bandwidths are stored in bytes/s and
printed as decimal MB/s; ds_nvme_tune's "GB/sec" is bytes / 1024**3 (GiB/s).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.model.sweep_result import Ranked  # noqa: E402
from iotune.host.cgroup import join_cgroup_preexec  # noqa: E402
from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS  # noqa: E402
from iotune.model.drive import DriveLimits  # noqa: E402
from iotune.model.sweep import SweepPoint, Trial  # noqa: E402
from iotune.sweep.target import BUILTIN_LIMITS, BUILTIN_RAMP_S, BUILTIN_RUNTIME_S, BUILTIN_SIZE  # noqa: E402
from iotune.sweep.executor import Executor, Target  # noqa: E402
from iotune.sweep.fio_executor import FioExecutor  # noqa: E402
from iotune.sweep.journal import Journal  # noqa: E402
from iotune.model.journal import SweepEnv  # noqa: E402
from iotune.model.sweep_result import Progress  # noqa: E402
from iotune.sweep.measure import Measurer  # noqa: E402
from iotune.sweep.aio.pipeline import search  # noqa: E402
from iotune.sweep.aio.propose import planned_trials  # noqa: E402
from iotune.sweep.aio.rank import rank, summarize_trials  # noqa: E402
from iotune.sweep.space import Profile, load_profile  # noqa: E402
from iotune.sweep.aio.steps_executor import StepsExecutor  # noqa: E402
from iotune.volumes.emulated import emulated_drive  # noqa: E402

VENV_BIN = Path(sys.executable).parent
GIB = 1024 ** 3
DS_LOG_RE = re.compile(r"^E2E (Read|Write) Speed = ([0-9.eE+-]+) GB/sec")
RESERVE_AFTER_DS_S = 100.0     # kept for the picks phase and teardown when ds_nvme_tune is cut short


class OutOfTime(Exception):
    """The budget is spent: stop this phase, keep what was measured."""


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def mb(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e6:.1f}"


# --------------------------------------------------------------------------- bookkeeping

class Recorder:
    """The result document, rewritten to disk after every phase."""

    def __init__(self, path: Path, args: argparse.Namespace, started: float) -> None:
        self.path, self.started = path, started
        self.doc: dict[str, Any] = {
            "benchmark": "sweep_vs_ds_nvme_tune", "issue": 4, "argv": sys.argv,
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "budget_s": args.budget_s, "pilot": args.pilot, "machine": machine(),
            "phases": {}, "complete": False,
        }

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def phase(self, name: str, data: dict[str, Any]) -> None:
        self.doc["phases"][name] = data
        self.save()

    def save(self) -> None:
        self.doc["elapsed_s"] = round(self.elapsed_s(), 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        os.replace(tmp, self.path)


def machine() -> dict[str, Any]:
    def out(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "")
    versions = out([sys.executable, "-c", "import importlib.metadata as m; "
                    "print(m.version('deepspeed'), m.version('torch'))"]).split()
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "cpu_model": cpu,
            "mem_total_kib": int(Path("/proc/meminfo").read_text().split()[1]),
            "fio": out(["fio", "--version"]), "python": platform.python_version(),
            "deepspeed": versions[0] if versions else "", "torch": versions[1] if len(versions) > 1 else "",
            "iotune_commit": out(["git", "rev-parse", "--short", "HEAD"]),
            "work_tree_modified": out(["git", "status", "--porcelain", "--untracked-files=no"]).splitlines()}


class LoadMeter:
    """Machine CPU use over a phase from /proc/stat (all processes, ours
    included), and the load averages at its start and end: other sessions
    share this machine."""

    def __init__(self) -> None:
        self.t0, self.load0 = self._cpu(), self._load()

    @staticmethod
    def _cpu() -> tuple[int, int]:
        vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = vals[3] + vals[4]
        return sum(vals) - idle, sum(vals)

    @staticmethod
    def _load() -> list[float]:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]

    def done(self) -> dict[str, Any]:
        busy1, total1 = self._cpu()
        frac = (busy1 - self.t0[0]) / max(total1 - self.t0[1], 1)
        return {"cpu_busy_fraction": round(frac, 3), "loadavg_start": self.load0, "loadavg_end": self._load()}


# --------------------------------------------------------------------------- iotune sweeps

def trial_row(t: Trial) -> dict[str, Any]:
    m = t.measurement
    row: dict[str, Any] = {"point": t.point.to_json(), "key": t.point.key(), "repeat": t.repeat,
                           "status": t.status, "seconds": round(t.seconds, 2), "started_at": t.started_at}
    if m:
        row.update(score_bytes_per_s=m.score, read_bytes_per_s=m.read_bytes_per_s,
                   write_bytes_per_s=m.write_bytes_per_s, read_lat_p99_us=m.read_lat_p99_us,
                   write_lat_p99_us=m.write_lat_p99_us, step_s=m.step_s, optimizer_step_s=m.optimizer_step_s)
    else:
        row["error"] = t.error
    return row


def ranked_row(r: Ranked) -> dict[str, Any]:
    return {"point": r.point.to_json(), "median_bytes_per_s": r.median, "scores": list(r.scores),
            "spread": r.spread, "read_bytes_per_s": r.read_bytes_per_s, "write_bytes_per_s": r.write_bytes_per_s,
            "failed": r.failed}


def describe(p: SweepPoint) -> str:
    bs = f"{p.block_size >> 20}M" if p.block_size >= 1 << 20 else f"{p.block_size >> 10}K"
    return (f"bs={bs} qd={p.queue_depth} threads={p.intra_op_parallelism} "
            f"single_submit={str(p.single_submit).lower()} overlap_events={str(p.overlap_events).lower()}")


def progress(label: str, deadline: float | None) -> Any:
    def on_trial(pr: Progress) -> None:
        t = pr.trial
        what = mb(t.measurement.score) + " MB/s" if t.measurement else f"FAILED {t.error[:80]}"
        say(f"{label} {pr.done}/{pr.planned} r{t.repeat} {describe(t.point)}: {what} ({t.seconds:.1f} s)")
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime(label)
    return on_trial


def run_search(label: str, executor: Executor, target: Target, prof: Profile, journal_dir: Path,
               deadline: float | None) -> dict[str, Any]:
    """One search (propose -> measure -> rank) over a fresh journal; cut short (partial) at `deadline`."""
    journal = Journal(journal_dir / "journal.jsonl")
    journal.start(SweepEnv(target=label))
    measurer = Measurer(executor, target, journal, progress(label, deadline), planned_trials(prof.space, prof.run))
    load, t0, partial = LoadMeter(), time.perf_counter(), False
    try:
        search(measurer, prof.space, prof.run)
    except OutOfTime:
        partial = True
        say(f"{label}: out of time after {len(journal.trials)} trials; ranking what was measured")
    wall = time.perf_counter() - t0
    ranking = rank(summarize_trials(journal.trials, executor.name))
    by_median = sorted((r for r in ranking if r.scores), key=lambda r: -r.median)
    pick = ranking[0].point if ranking and ranking[0].scores else None
    return {"profile": prof.name, "search": prof.run.search, "executor": executor.name, "wall_s": wall,
            "trials": len(journal.trials), "planned": measurer.planned, "partial": partial,
            "pick": pick.to_json() if pick else None, "pick_described": describe(pick) if pick else None,
            "pick_ranked": ranked_row(ranking[0]) if pick else None,
            "best_by_median": ranked_row(by_median[0]) if by_median else None,
            "ranking_top": [ranked_row(r) for r in ranking[:8]],
            "space": {k: list(v) for k, v in vars(prof.space).items()}, "run": vars(prof.run),
            "trial_rows": [trial_row(t) for t in journal.trials], "load": load.done()}


def fio_target(directory: Path, prof: Profile, cgroup: str | None) -> Target:
    """As iotune/sweep/aio/command.py builds it for the built-in drive."""
    directory.mkdir(parents=True, exist_ok=True)
    return Target(directory, prof.run.file_bytes, prof.run.files, cgroup,
                  prof.run.runtime_s or BUILTIN_RUNTIME_S, prof.run.ramp_s or BUILTIN_RAMP_S)


def adaptive_profile(pilot: bool) -> Profile:
    prof = load_profile("quick" if pilot else "default")
    return replace(prof, run=replace(prof.run, confirm_top=0))


def grid_profile(pilot: bool) -> Profile:
    prof = load_profile("ds-nvme-tune-grid")
    space = replace(prof.space, overlap_events=(True,))      # fio has no overlap_events: halves are identical
    if pilot:
        space = replace(space, block_size=(256 << 10, 1 << 20), queue_depth=(4, 16), single_submit=(False,))
    return replace(prof, space=space, run=replace(prof.run, search="grid", repeats=1, confirm_top=0))


# --------------------------------------------------------------------------- closed loop

def closed_loop(target: Target, pick: SweepPoint, pairs: int, steps: int, deadline: float) -> dict[str, Any]:
    """Optimizer-step time, pick vs DeepSpeed's default aio settings,
    alternating (pick first in even pairs, default first in odd ones)."""
    d = DEEPSPEED_AIO_DEFAULTS
    default = SweepPoint(d.block_size, d.queue_depth, d.intra_op_parallelism, d.single_submit, d.overlap_events)
    ex = StepsExecutor(steps=steps, size="tiny", strategy="nvme-opt")
    runs: list[dict[str, Any]] = []
    load, t0, partial = LoadMeter(), time.perf_counter(), False
    for i in range(pairs):
        order = [("pick", pick), ("default", default)] if i % 2 == 0 else [("default", default), ("pick", pick)]
        for label, point in order:
            if time.monotonic() > deadline:
                partial = True
                break
            runs.append(one_steps_run(ex, point, target, label, i))
    ratios = []
    for i in range(pairs):
        by = {r["label"]: r for r in runs if r["pair"] == i and r.get("optimizer_step_s")}
        if "pick" in by and "default" in by:
            ratios.append(by["pick"]["optimizer_step_s"] / by["default"]["optimizer_step_s"])
    return {"pick": pick.to_json(), "default": default.to_json(), "steps": steps, "size": "tiny",
            "strategy": "nvme-opt", "pairs": pairs, "partial": partial, "wall_s": time.perf_counter() - t0,
            "same_aio_args": (pick.block_size, pick.queue_depth, pick.intra_op_parallelism)
            == (default.block_size, default.queue_depth, default.intra_op_parallelism),
            "runs": runs, "summary": {lab: spread([r["optimizer_step_s"] for r in runs
                                                  if r["label"] == lab and r.get("optimizer_step_s")])
                                      for lab in ("pick", "default")},
            "step_s": {lab: spread([r["step_s"] for r in runs if r["label"] == lab and r.get("step_s")])
                       for lab in ("pick", "default")},
            "ratio_pick_over_default": spread(ratios), "pair_ratios": ratios, "load": load.done()}


def one_steps_run(ex: StepsExecutor, point: SweepPoint, target: Target, label: str, pair: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    row: dict[str, Any] = {"label": label, "pair": pair, "point": point.to_json()}
    try:
        m, raw = ex.run(point, target)
        row.update(optimizer_step_s=m.optimizer_step_s, step_s=m.step_s,
                   per_step=[{k: r.get(k) for k in ("step", "step_s", "optimizer_step_s", "loss")}
                             for r in raw.get("steps", [])])
    except Exception as e:      # a failed run is recorded, not fatal
        row["error"] = str(e)[:500]
    row["wall_s"] = time.perf_counter() - t0
    say(f"closed-loop pair {pair} {label} {describe(point)}: optimizer step "
        f"{row.get('optimizer_step_s', float('nan')):.4f} s (run {row['wall_s']:.0f} s)")
    return row


def spread(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


# --------------------------------------------------------------------------- ds_nvme_tune

def run_ds_nvme_tune(work: Path, nvme_dir: Path, cgroup: str | None, deadline: float,
                     sweep_config: Path | None, io_size: str | None) -> dict[str, Any]:
    """DeepSpeed's tuner in its own process group inside the drive's cgroup
    (its ds_io children inherit both); killed with its group at the deadline
    or on Ctrl-C."""
    log_dir = work / "ds_logs"
    argv = [str(VENV_BIN / "ds_nvme_tune"), "--nvme_dir", str(nvme_dir), "--log_dir", str(log_dir)]
    if sweep_config:
        argv += ["--sweep_config", str(sweep_config)]
    if io_size:
        argv += ["--io_size", io_size]
    nvme_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = work / "ds_nvme_tune.stdout", work / "ds_nvme_tune.stderr"
    say(f"ds_nvme_tune: {' '.join(argv)} (deadline in {deadline - time.monotonic():.0f} s)")
    load, t0, killed = LoadMeter(), time.perf_counter(), None
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work,
                                start_new_session=True, preexec_fn=join_cgroup_preexec(cgroup))
        try:
            killed = wait_until(proc, deadline, log_dir)
        finally:
            if proc.poll() is None:
                kill_group(proc)
                killed = killed or "interrupted"
    wall = time.perf_counter() - t0
    stdout = out_path.read_text(errors="replace")
    logs = read_ds_logs(log_dir)
    printed = parse_printed(stdout)
    pick, pick_source = (SweepPoint.from_json(printed["point"]), "printed aio block") if printed else (None, "")
    if pick is None and logs:
        pick, pick_source = pick_from_logs(logs), "completed ds_io logs (DeepSpeed's rule: max read+write GB/sec)"
    return {"argv": argv, "wall_s": wall, "returncode": proc.returncode, "stopped": killed,
            "partial": killed is not None or printed is None, "runs": len(logs), "runs_expected": expected_runs(sweep_config),
            "printed": printed, "pick": pick.to_json() if pick else None,
            "pick_described": describe(pick) if pick else None, "pick_source": pick_source, "logs": logs,
            "stdout_tail": stdout[-3000:], "stderr_tail": err_path.read_text(errors="replace")[-3000:],
            "load": load.done()}


def wait_until(proc: subprocess.Popen[bytes], deadline: float, log_dir: Path) -> str | None:
    last = -1
    while proc.poll() is None:
        if time.monotonic() > deadline:
            say("ds_nvme_tune: budget reached, stopping its process group")
            return "budget"
        n = sum(1 for _ in log_dir.rglob("*.txt")) if log_dir.exists() else 0
        if n != last:
            say(f"ds_nvme_tune: {n} ds_io run(s) started")
            last = n
        time.sleep(2.0)
    return None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):     # grandchildren (ds_io) may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)


def expected_runs(sweep_config: Path | None) -> int:
    grid: dict[str, list[Any]] = (json.loads(sweep_config.read_text()) if sweep_config else
                                  {"block_size": [0] * 2, "queue_depth": [0] * 2, "sequential_requests": [0] * 2,
                                   "single_submit": [0] * 2, "io_parallel": [0] * 4})   # DeepSpeed 0.19.8's default
    n = 1
    for values in grid.values():
        n *= len(values)
    return 2 * n      # read and write


def read_ds_logs(log_dir: Path) -> list[dict[str, Any]]:
    """Every completed ds_io run: its op and configuration (from the log
    file's name, as DeepSpeed's parse_nvme_stats does) and its E2E speed."""
    rows = []
    for path in sorted(log_dir.rglob("*.txt")) if log_dir.exists() else []:
        speed = None
        for line in path.read_text(errors="replace").splitlines():
            m = DS_LOG_RE.match(line)
            if m:
                speed = float(m.group(2))
        fields = path.stem.split("_")     # e.g. read_single_overlap_ftd1_d32_bs1M_p4
        if speed is None or len(fields) != 7:
            continue
        rows.append({"op": fields[0], "file": path.name, "config": fields[1:], "gib_per_s": speed,
                     "bytes_per_s": speed * GIB, "point": ds_point(fields[1:]).to_json()})
    return rows


def ds_point(cfg: list[str]) -> SweepPoint:
    """single|block, sequential|overlap, ftdN, dQ, bsB, pT -> SweepPoint."""
    bs = cfg[4][2:]
    size = int(bs[:-1]) << {"K": 10, "M": 20, "G": 30}[bs[-1]] if bs[-1] in "KMG" else int(bs)
    return SweepPoint(block_size=size, queue_depth=int(cfg[3][1:]), intra_op_parallelism=int(cfg[5][1:]),
                      single_submit=cfg[0] == "single", overlap_events=cfg[1] == "overlap")


def pick_from_logs(logs: list[dict[str, Any]]) -> SweepPoint | None:
    """DeepSpeed's generate_aio_param rule on the configs with both a read and a write log."""
    total: dict[tuple[str, ...], dict[str, float]] = {}
    for row in logs:
        total.setdefault(tuple(row["config"]), {})[row["op"]] = row["gib_per_s"]
    both = {k: v["read"] + v["write"] for k, v in total.items() if "read" in v and "write" in v}
    return ds_point(list(max(both, key=lambda k: both[k]))) if both else None


def parse_printed(stdout: str) -> dict[str, Any] | None:
    """What ds_nvme_tune prints at the end: 'Best performance (GB/sec): read =
    R, write = W' and a JSON {"aio": {...}} block (its documented output)."""
    m = re.search(r"Best performance \(GB/sec\): read =\s*([0-9.]+), write =\s*([0-9.]+)", stdout)
    if not m:
        return None
    block = stdout[m.end():]
    start = block.find("{")
    try:
        aio = json.JSONDecoder().raw_decode(block[start:])[0]["aio"]
    except (ValueError, KeyError):
        return None
    point = SweepPoint(block_size=int(aio["block_size"]), queue_depth=int(aio["queue_depth"]),
                       intra_op_parallelism=int(aio["num_threads"]),
                       single_submit=aio["single_submit"] == "true", overlap_events=aio["overlap_events"] == "true")
    return {"read_gb_per_s_printed": float(m.group(1)), "write_gb_per_s_printed": float(m.group(2)),
            "aio_block": aio, "point": point.to_json(),
            "key_types": {k: type(v).__name__ for k, v in aio.items()}}


# --------------------------------------------------------------------------- picks on equal terms

def measure_picks(picks: dict[str, SweepPoint], target: Target, repeats: int, journal_dir: Path,
                  deadline: float) -> dict[str, Any]:
    """Each distinct pick `repeats` times with the fio executor, the order
    rotated every round; labels sharing a point share its measurements."""
    journal = Journal(journal_dir / "journal.jsonl")
    journal.start(SweepEnv(target="picks"))
    measurer = Measurer(FioExecutor(), target, journal, progress("picks", None))
    distinct = list(dict.fromkeys(p.key() for p in picks.values()))
    by_key = {p.key(): p for p in picks.values()}
    load, t0, partial = LoadMeter(), time.perf_counter(), False
    for rep in range(repeats):
        order = distinct[rep % len(distinct):] + distinct[: rep % len(distinct)]
        for key in order:
            if time.monotonic() > deadline:
                partial = True
                break
            measurer.measure(by_key[key], rep)
    rows = {r.point.key(): r for r in summarize_trials(journal.trials, "fio")}
    summary = {}
    for label, p in picks.items():
        r = rows.get(p.key())
        scores = list(r.scores) if r else []
        summary[label] = {"point": p.to_json(), "described": describe(p), **(spread(scores) or {}),
                          "read_bytes_per_s": r.read_bytes_per_s if r else None,
                          "write_bytes_per_s": r.write_bytes_per_s if r else None}
    best = summary.get("grid_best", {}).get("median")
    for label, s in summary.items():
        if best and s.get("median"):
            s["fraction_of_grid_best"] = s["median"] / best
            s["fraction_range"] = [s["min"] / best, s["max"] / best]
    return {"repeats": repeats, "partial": partial, "wall_s": time.perf_counter() - t0, "summary": summary,
            "trial_rows": [trial_row(t) for t in journal.trials], "load": load.done()}


# --------------------------------------------------------------------------- main

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    today = dt.date.today().isoformat()
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"sweep_vs_ds_nvme_tune-{today}.json")
    p.add_argument("--budget-s", type=float, default=2400.0, help="stop everything after this long (s)")
    p.add_argument("--pick-repeats", type=int, default=3)
    p.add_argument("--pairs", type=int, default=3, help="closed loop: pick/default pairs")
    p.add_argument("--steps", type=int, default=8, help="closed loop: training steps per run")
    p.add_argument("--aio", action="store_true", help="also run the aio-executor search if the budget allows")
    p.add_argument("--aio-min-s", type=float, default=420.0, help="budget left needed to start the aio search")
    p.add_argument("--pilot", action="store_true",
                   help="a few minutes' smoke test: quick profile, 4-point grid, 2-config ds_nvme_tune grid")
    return p.parse_args()


def pilot_ds_config(work: Path) -> Path:
    path = work / "ds_sweep_pilot.json"
    path.write_text(json.dumps({"block_size": ["1M"], "queue_depth": [32], "sequential_requests": [False],
                                "single_submit": [False], "io_parallel": [1, 2]}))
    return path


def run(args: argparse.Namespace, rec: Recorder, work: Path) -> None:
    deadline = rec.started + args.budget_s
    limits = DriveLimits(**BUILTIN_LIMITS)
    with emulated_drive(None, BUILTIN_SIZE, limits, fstype="ext4") as drive:
        root = Path(drive.path)
        rec.doc["drive"] = {"limits": drive.limits.to_json(), "described": limits.describe(),
                            "device": drive.device.path, "size_bytes": BUILTIN_SIZE, "fstype": "ext4",
                            "mount": str(root), "cgroup": drive.cgroup,
                            "ceiling_bytes_per_s_1M_qd8": drive.limits.ceiling_bytes_per_s(1 << 20, 8)}
        say(f"drive {drive.device.path}: {limits.describe()}, ext4 at {root}, cgroup {drive.cgroup}")
        prof = adaptive_profile(args.pilot)
        target = fio_target(root / "fio", prof, drive.cgroup)
        fio = run_search("iotune-fio", FioExecutor(), target, prof, work / "j-fio", deadline)
        rec.phase("iotune_fio", fio)
        gprof = grid_profile(args.pilot)
        grid = run_search("grid", FioExecutor(), fio_target(root / "fio", gprof, drive.cgroup), gprof,
                          work / "j-grid", deadline)
        rec.phase("grid", grid)
        pick = SweepPoint.from_json(fio["pick"])
        steps_target = Target(root / "steps", cgroup=drive.cgroup)
        steps_target.directory.mkdir()
        rec.phase("closed_loop", closed_loop(steps_target, pick, 1 if args.pilot else args.pairs,
                                             3 if args.pilot else args.steps, deadline))
        cfg = pilot_ds_config(work) if args.pilot else None
        ds = run_ds_nvme_tune(work, root / "ds", drive.cgroup, deadline - RESERVE_AFTER_DS_S, cfg,
                              "64M" if args.pilot else None)
        rec.phase("ds_nvme_tune", ds)
        shutil.rmtree(root / "ds", ignore_errors=True)     # its 400M read and write files
        picks = {"grid_best": SweepPoint.from_json(grid["best_by_median"]["point"]), "iotune": pick}
        if ds["pick"]:
            picks["ds_nvme_tune"] = SweepPoint.from_json(ds["pick"])
        rec.phase("picks", measure_picks(picks, target, 1 if args.pilot else args.pick_repeats,
                                         work / "j-picks", deadline))
        if args.aio and deadline - time.monotonic() > args.aio_min_s:
            from iotune.sweep.aio.executor import AioExecutor

            aprof = replace(prof, space=replace(prof.space, engine=("libaio",)))
            rec.phase("iotune_aio", run_search("iotune-aio", AioExecutor(), target, aprof, work / "j-aio", deadline))
        elif args.aio:
            rec.doc["phases"]["iotune_aio"] = {"skipped": f"under {args.aio_min_s:.0f} s of budget left"}
    rec.doc["complete"] = True


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("error: run as root (loop devices, FUSE, blkio cgroups)", file=sys.stderr)
        return 2
    rec = Recorder(args.out, args, time.monotonic())
    with tempfile.TemporaryDirectory(prefix="iotune-vs-ds-") as tmp:
        try:
            run(args, rec, Path(tmp))
        except KeyboardInterrupt:
            rec.doc["interrupted"] = True
            say("interrupted: drive torn down, partial results saved")
            return 130
        finally:
            rec.save()
            say(f"results: {args.out} ({rec.elapsed_s():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
