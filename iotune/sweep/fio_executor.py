"""The fio executor: a swap-like job (write `files` tensor files with
O_DIRECT, then read them back) at one point, run with
--output-format=json and parsed into typed results. The raw JSON is kept.

Mapping of a SweepPoint to fio: block_size -> bs, queue_depth -> iodepth,
intra_op_parallelism -> numjobs (threads sharing the bytes, as DeepSpeed's
intra-op threads share a tensor), single_submit -> iodepth_batch_submit=1
(else the whole queue depth), engine -> ioengine. overlap_events has no fio
equivalent and is ignored here (the aio executor measures it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..host.cgroup import join_cgroup_preexec
from ..host.proc import last_line, not_installed, run_in_own_group
from ..model.sweep import Measurement, SweepPoint
from ..model.sweep_result import Ranked
from .executor import Target, TrialFailed

JOBS = (("swap-out", "write"), ("swap-in", "read"))


def job_options(point: SweepPoint, target: Target) -> list[tuple[str, str]]:
    """(option, value) pairs shared by both jobs."""
    per_job = target.files * target.file_bytes // point.intra_op_parallelism
    per_job -= per_job % point.block_size
    if per_job // target.files < point.block_size:       # fio splits a job's size over its files
        raise TrialFailed(f"{point.intra_op_parallelism} threads sharing each {target.file_bytes} B file leave "
                          f"each less than one {point.block_size} B block; raise --file-bytes or lower the "
                          f"block size or the threads")
    return [
        ("directory", str(target.files_dir)), ("nrfiles", str(target.files)), ("size", str(per_job)),
        ("bs", str(point.block_size)), ("iodepth", str(point.queue_depth)),
        ("iodepth_batch_submit", "1" if point.single_submit else str(point.queue_depth)),
        ("numjobs", str(point.intra_op_parallelism)), ("ioengine", point.engine), ("direct", "1"),
        ("file_service_type", "sequential"), ("group_reporting", "1"), ("unlink", "1"),
    ] + ([("time_based", "1"), ("runtime", f"{target.runtime_s:g}"), ("ramp_time", f"{target.ramp_s:g}")]
         if target.runtime_s > 0 else [])


def fio_argv(point: SweepPoint, target: Target, output: Path, concurrent: bool = False) -> list[str]:
    """fio's command line for one trial: the writes, then the reads (with
    `concurrent`, both at once, as a pipelined swapper moves them)."""
    argv = ["fio", "--thread", "--output-format=json", f"--output={output}"]
    for name, rw in JOBS:
        argv += [f"--name={name}", f"--rw={rw}"] + [f"--{k}={v}" for k, v in job_options(point, target)]
        if name == "swap-in":
            argv.append("--new_group" if concurrent else "--stonewall")    # reported apart either way
    return argv


def fio_jobfile(point: SweepPoint, target: Target) -> str:
    """The same trial as a fio job file (`fio FILE` runs it)."""
    lines = [f"# iotune sweep point {point.key()}: {json.dumps(point.to_json(), sort_keys=True)}", "",
             "[global]", "thread", ""]
    for name, rw in JOBS:
        lines.append(f"[{name}]")
        lines.append(f"rw={rw}")
        lines += [f"{k}={v}" for k, v in job_options(point, target)]
        if name == "swap-in":
            lines.append("stonewall")
        lines.append("")
    return "\n".join(lines)


def export_jobfiles(ranking: list[Ranked], target: Target, directory: Path) -> int:
    """Write the fio job file of every ranked point into `directory`; returns how many.
    The jobs do their I/O in the drive's directory itself (the sweep's own
    scratch directory is gone when they run)."""
    directory.mkdir(parents=True, exist_ok=True)
    where = replace(target, scratch=None)
    for r in ranking:
        (directory / f"{r.point.key()}.fio").write_text(fio_jobfile(r.point, where))
    return len(ranking)


def parse_fio_json(doc: dict[str, Any]) -> Measurement:
    """Measurement from fio's JSON: bandwidth from io_bytes/runtime (fio's
    bw_mean is 0 for runs under a second), latency percentiles from clat_ns."""
    by_name = {j.get("jobname"): j for j in doc.get("jobs", [])}
    vals: dict[str, Any] = {}
    for name, rw in JOBS:
        job = by_name.get(name)
        if job is None:
            raise TrialFailed(f"fio output has no job '{name}'", {"fio": doc})
        side = job[rw]
        if job.get("error"):
            raise TrialFailed(f"fio job {name} failed with error {job['error']}", {"fio": doc})
        runtime_s = side.get("runtime", 0) / 1000
        vals[f"{rw}_bytes_per_s"] = side["io_bytes"] / runtime_s if runtime_s > 0 else 0.0
        vals[f"{rw}_iops"] = side["total_ios"] / runtime_s if runtime_s > 0 else 0.0
        pct = side.get("clat_ns", {}).get("percentile", {})
        for q, label in (("50.000000", "p50"), ("99.000000", "p99")):
            if q in pct:
                vals[f"{rw}_lat_{label}_us"] = pct[q] / 1000
    jobs = list(by_name.values())
    vals["cpu_usr_pct"] = sum(j.get("usr_cpu", 0.0) for j in jobs) / len(jobs)
    vals["cpu_sys_pct"] = sum(j.get("sys_cpu", 0.0) for j in jobs) / len(jobs)
    return Measurement(**vals)


class FioExecutor:
    """fio at one point: the writes, then the reads; with `concurrent`,
    reads and writes at once (the drive's rates under a pipelined swapper)."""

    name = "fio"

    def __init__(self, timeout_s: float = 600.0, concurrent: bool = False) -> None:
        self.timeout_s = timeout_s
        self.concurrent = concurrent

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        if shutil.which("fio") is None:
            raise TrialFailed(not_installed("fio"))
        output = target.files_dir / f".iotune-fio-{point.key()}.json"
        try:
            proc = run_in_own_group(fio_argv(point, target, output, self.concurrent), self.timeout_s,
                                    join_cgroup_preexec(target.cgroup))
            text = output.read_text() if output.exists() else ""
        except subprocess.TimeoutExpired:
            raise TrialFailed(f"fio did not finish within {self.timeout_s:.0f} s") from None
        finally:
            output.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise TrialFailed(f"fio failed (exit {proc.returncode}): {last_line(proc.stderr or text, 'no message')}",
                              {"stderr": proc.stderr[-4000:]})
        try:
            doc = json.loads(text[text.index("{"):])
        except ValueError:
            raise TrialFailed("fio wrote no JSON result", {"stdout": text[-4000:]}) from None
        return parse_fio_json(doc), {"fio": doc}
