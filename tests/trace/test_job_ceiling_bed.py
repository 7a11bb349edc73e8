"""The job-pattern ceiling end to end, at CI scale: the built-in tiny
nvme-opt workload traced by `iotune trace` on an ext4 loop drive capped at
CAP = 40 MB/s per direction by a blkio cgroup (the job, the trace and the
report all run in it), at its own aio block size (512 KiB, not DeepSpeed's
1 MiB); then `iotune report RUN --ceiling` replays the saved schedule
without compute at DeepSpeed's defaults and at the job's settings, and
`iotune report RUN` shows that ceiling again from the run alone.

Why 40 MB/s: the tiny step swaps 46.4 MB each way against ~17 ms of
compute, so it is I/O-bound; at 100 MB/s the throttle's burst when the
direction changes is a larger share of a shorter step
(tests/sweep/test_replay_bed.py). Measured here (2026-11-28, 2 cores shared with
other jobs, load 8-9): the module in 160 s (trace and report --ceiling at 2
settings x 5 replays 130 s, the fio fallback 19 s); ceiling 41.3 MB/s
(40.2–41.6, 5 runs, the job's 512 KiB setting), the median steady step
40.9 MB/s while busy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.host.cgroup import join_cgroup_preexec
from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS, AioSettings
from iotune.model.runfile import load_run
from iotune.model.verdict import Verdict
from iotune.volumes.scratch import scratch_drive
from tests.conftest import needs_bpf, needs_deepspeed, needs_fio, needs_root

CAP = 40_000_000
STEPS = 4                      # step 0 creates Adam's moments; steps 1-2 are steady, 3 the last
OWN_BLOCK = 512 * 1024

pytestmark = [needs_deepspeed, needs_root, needs_bpf]


@dataclass(frozen=True)
class Measured:
    run_dir: Path
    swap: Path                   # the job's nvme_path
    cgroup: str                  # the drive's cap
    report: dict[str, Any]       # `report RUN --ceiling --json`
    stderr: str


def iotune(cgroup: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "iotune", *argv], capture_output=True, text=True, timeout=900,
                       preexec_fn=join_cgroup_preexec(cgroup), cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Measured]:
    work = tmp_path_factory.mktemp("job-ceiling")
    with scratch_drive(work, 1 << 30, CAP, "ext4") as drive:
        assert drive.mount_point is not None and drive.cgroup is not None
        swap = drive.mount_point / "swap"
        swap.mkdir()
        run_dir = work / "run"
        iotune(str(drive.cgroup), "trace", "-o", str(run_dir), "-p", str(swap), "--", sys.executable, "-W", "ignore",
               "-m", "iotune.workloads.train", "--strategy", "nvme-opt", "--size", "tiny", "--steps", str(STEPS),
               "--nvme-path", str(swap), "--aio-block-size", str(OWN_BLOCK), cwd=work)
        r = iotune(str(drive.cgroup), "report", str(run_dir), "--ceiling", "--json", cwd=work)
        yield Measured(run_dir, swap, str(drive.cgroup), json.loads(r.stdout), r.stderr)


def distance(v: Verdict) -> dict[str, Any]:
    [f] = v.of_kind("distance")
    return f.figures


def test_the_trace_saves_a_steady_steps_schedule_with_the_jobs_settings(measured: Measured) -> None:
    run = load_run(measured.run_dir)
    s = run.swap_schedule
    assert s is not None and 1 <= s.step < STEPS and s.read_bytes > 0 and s.write_bytes > 0
    assert s.traced_aio == AioSettings(block_size=OWN_BLOCK)          # the hook's record of the job's handle
    assert s.swap_dir == str(measured.swap)


def test_report_ceiling_replays_the_jobs_pattern_at_the_cap_and_bounds_its_steady_steps(measured: Measured) -> None:
    v = Verdict.from_json(measured.report["verdict"])
    d = distance(v)
    assert d["ceiling_kind"] == "job-pattern", d
    assert d["ceiling_bytes_per_s"] == pytest.approx(CAP, rel=0.10), d
    assert d["ceiling_runs"] == 5
    assert d["steady_steps"] == 2
    assert d["compared_bytes_per_s"] == d["steady_bytes_per_s_busy"]
    assert d["compared_bytes_per_s"] <= d["ceiling_max_bytes_per_s"], d
    assert 0.8 <= d["share_of_ceiling"] <= 1.0, d
    assert not [f for f in v.of_kind("note") if "re-measure" in f.headline]
    [what_if] = [f.figures for f in v.of_kind("advice") if "RAID0" in f.headline]
    assert what_if["drive_bytes_per_s"] == d["ceiling_bytes_per_s"]
    assert "this job's swap pattern replayed" in str(what_if["drive_bandwidth_source"])
    assert "ceiling: replaying step " in measured.stderr and "2 aio setting(s)" in measured.stderr
    assert "probing" not in measured.stderr            # no fio: the drive's ceiling is the job's own pattern
    # the ceiling went into the run, at both settings, 5 times each
    saved = load_run(measured.run_dir).job_ceiling
    assert saved is not None and saved.device == d["device"]
    assert [r.aio for r in saved.ceiling.settings] == [DEEPSPEED_AIO_DEFAULTS, AioSettings(block_size=OWN_BLOCK)]
    assert all(len(r.bytes_per_s) == 5 for r in saved.ceiling.settings)
    assert saved.ceiling.bytes_per_s == d["ceiling_bytes_per_s"]


def test_report_shows_the_measured_ceiling_again_without_the_drive(measured: Measured, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["report", str(measured.run_dir), "--json"])
    assert r.exit_code == 0, r.stderr
    again = distance(Verdict.from_json(json.loads(r.stdout)["verdict"]))
    then = distance(Verdict.from_json(measured.report["verdict"]))
    assert {k: again[k] for k in ("ceiling_kind", "ceiling_bytes_per_s", "ceiling_source", "share_of_ceiling")} == \
        {k: then[k] for k in ("ceiling_kind", "ceiling_bytes_per_s", "ceiling_source", "share_of_ceiling")}
    assert "saved with the run" in r.stderr


@needs_fio
def test_a_run_without_a_schedule_gets_the_fio_probe_and_says_why(measured: Measured, tmp_path: Path) -> None:
    """The same run as an older iotune saved it (no schedule, no ceiling): --ceiling falls back to fio."""
    doc = json.loads((measured.run_dir / "run.json").read_text())
    doc["swap_schedule"] = doc["job_ceiling"] = None
    older = tmp_path / "older"
    older.mkdir()
    (older / "run.json").write_text(json.dumps(doc))
    for name in ("timeline.csv", "timeline.npz"):
        (older / name).write_bytes((measured.run_dir / name).read_bytes())
    r = iotune(measured.cgroup, "report", str(older), "--ceiling", "--json", cwd=tmp_path)
    d = distance(Verdict.from_json(json.loads(r.stdout)["verdict"]))
    assert d["ceiling_kind"] == "other-pattern" and str(d["ceiling_source"]).startswith("fio probe (--ceiling) in ")
    assert "ceiling: the run holds no swap schedule of a steady NVMe optimizer step" in r.stderr
    assert "(1 MiB requests: fio's pattern, not this job's)" in r.stderr
    assert d["share_of_ceiling"] <= 1.0
    assert load_run(older).job_ceiling is None
