"""The verdict on real traced runs: the built-in workload on a loop drive
capped with cgroup blkio (an NVMe stand-in with a known limit), traced by
`iotune trace --json` inside the drive's cgroup. Each run is recorded once
per module; the tests then check the rules on it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iotune.analysis.attribution import steady, step_breakdowns
from iotune.model.runfile import load_run
from iotune.model.verdict import NO_TRAINING, STARTUP_DOMINATED, STORAGE_BOUND, Verdict

from tests.conftest import needs_bpf, needs_deepspeed, needs_fio, needs_root

pytestmark = [needs_root]

CAP = 40_000_000        # bytes/s per direction: the optimizer step (93 MB) takes about 2.3 s
STEPS = 4               # step 0 creates Adam's moments; steps 1-2 are steady (what the rules read), 3 the last


@pytest.fixture(scope="module")
def drive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A 1 GiB ext4 loop drive capped at CAP read and CAP write."""
    from iotune.volumes.scratch import scratch_drive

    with scratch_drive(tmp_path_factory.mktemp("capped"), 1 << 30, CAP, "ext4") as d:
        yield d


def traced(drive: Any, out: Path, argv: list[str], *trace_args: str) -> tuple[dict[str, Any], Verdict, str]:
    """`iotune trace --json` of argv with everything in the drive's cgroup:
    (the JSON document, its verdict, stderr)."""
    from iotune.host.cgroup import join_cgroup_preexec

    r = subprocess.run([sys.executable, "-m", "iotune", "trace", "--json", "-o", str(out), "-d", drive.device.name,
                        *trace_args, "--", *argv], capture_output=True, text=True, timeout=900,
                       preexec_fn=join_cgroup_preexec(drive.cgroup), cwd=out.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    return doc, Verdict.from_json(doc["verdict"]), r.stderr


def train(drive: Any, strategy: str) -> list[str]:
    swap = drive.mount_point / f"swap-{strategy}"
    swap.mkdir(exist_ok=True)
    return [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", strategy, "--size", "tiny",
            "--steps", str(STEPS), "--nvme-path", str(swap)]


@pytest.fixture(scope="module")
def nvme_opt(drive: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Verdict, Path]:
    out = tmp_path_factory.mktemp("nvme-opt") / "run"
    doc, v, _ = traced(drive, out, train(drive, "nvme-opt"), "--ceiling", "--drive-tbw", "600TB")
    return doc, v, out


def figures(v: Verdict, kind: str) -> dict[str, Any]:
    [f] = v.of_kind(kind)[:1]
    return f.figures


@needs_bpf
@needs_deepspeed
@needs_fio
def test_nvme_opt_on_a_capped_drive_is_storage_bound(nvme_opt: tuple[dict[str, Any], Verdict, Path]) -> None:
    doc, v, out = nvme_opt
    limit = figures(v, "limit")
    assert limit["step_limit"] == STORAGE_BOUND, v.to_json()
    # the run as a whole is storage-bound, unless DeepSpeed's start-up took over 80% of it (it builds
    # its ops first when their cache is cold, minutes on 2 cores): then it says so, naming the step's limit
    if limit["steps_share_of_run"] >= 0.2:
        assert v.limit == STORAGE_BOUND and v.summary.startswith("Storage-bound: "), v.to_json()
    else:
        assert v.limit == STARTUP_DOMINATED and "; storage-bound: " in v.summary, v.to_json()
    run = load_run(out)
    rows = steady(step_breakdowns(run))
    stall = figures(v, "stall")
    # the stall agrees with the optimizer step's timing: the optimizer's bytes cannot cross a drive
    # capped at CAP per direction faster than max(read, write) / CAP, so at least that long is busy;
    # and the busy time fits inside the optimizer step, which it mostly fills
    opt = [r.block_by_phase["optimizer"] for r in rows]
    floor_s = min(max(w.read_bytes, w.write_bytes) for w in opt) / CAP
    assert 0.9 * floor_s <= stall["optimizer_stall_s"] <= stall["optimizer_s"] + 1e-9, (floor_s, stall)
    # and on a capped drive the optimizer step is that I/O: Adam on 3.7 M parameters takes milliseconds
    assert stall["optimizer_stall_share"] >= 0.85, stall
    assert stall["stall_share"] >= 0.5, stall
    # what to do: with 2 drives the optimizer step takes less than now
    what_if = next(f.figures for f in v.of_kind("advice") if "RAID0" in f.headline)
    assert what_if["optimizer_s_with_2_drives"] < 0.75 * stall["optimizer_s"], what_if


@needs_bpf
@needs_deepspeed
@needs_fio
def test_the_ceiling_measures_the_cap(nvme_opt: tuple[dict[str, Any], Verdict, Path]) -> None:
    _, v, _ = nvme_opt
    d = figures(v, "distance")
    # the run holds its swap schedule: --ceiling replays it in the drive's cgroup (fio only without one:
    # tests/trace/test_job_ceiling_bed.py), reading then writing at the cap
    assert d["ceiling_kind"] == "job-pattern" and str(d["ceiling_source"]).startswith("this job's swap pattern "), d
    assert 0.85 * CAP <= d["ceiling_bytes_per_s"] <= 1.15 * CAP, d
    # the job's steady steps read, then write, at the cap while busy; a share is never shown above 100 %
    assert 0.7 <= d["share_of_ceiling"] <= 1.0, d
    # so a deeper queue would not help: more drives would
    advice = next(f.figures for f in v.of_kind("advice") if "in flight" in f.headline)
    assert advice["action"] == "add drives (RAID0) or use a faster drive", advice


@needs_bpf
@needs_deepspeed
@needs_fio
def test_endurance_of_the_recorded_run(nvme_opt: tuple[dict[str, Any], Verdict, Path]) -> None:
    _, v, out = nvme_opt
    run = load_run(out)
    rows = steady(step_breakdowns(run))
    # by hand from the run's own steady steps: block bytes written / their seconds
    per_s = sum(r.block.write_bytes for r in rows) / sum(r.total_s for r in rows)
    e = figures(v, "endurance")
    assert e["written_bytes_per_hour"] == pytest.approx(per_s * 3600)
    assert e["capacity_bytes"] == 1 << 30                         # the loop drive's size, recorded by the trace
    assert e["drive_writes_per_day"] == pytest.approx(per_s * 86_400 / (1 << 30))
    assert e["tbw_source"] == "--drive-tbw" and e["days_to_tbw"] == pytest.approx(600e12 / (per_s * 86_400))


@needs_bpf
@needs_deepspeed
def test_cpu_offload_is_not_storage_bound(drive: Any, tmp_path: Path) -> None:
    _, v, _ = traced(drive, tmp_path / "run", train(drive, "cpu"))
    assert v.limit != STORAGE_BOUND and figures(v, "limit")["step_limit"] != STORAGE_BOUND, v.to_json()
    assert not v.of_kind("advice")
    assert figures(v, "stall")["stall_share"] < 0.1


@needs_bpf
def test_dd_gets_no_training_verdict(drive: Any, tmp_path: Path) -> None:
    argv = ["dd", "if=/dev/zero", f"of={drive.mount_point / 'dd.bin'}", "bs=1M", "count=32", "oflag=direct",
            "status=none"]
    doc, v, _ = traced(drive, tmp_path / "run", argv)
    assert v.limit == NO_TRAINING and not v.of_kind("stall") and not v.of_kind("advice")
    d = figures(v, "distance")
    assert d["device"] == drive.device.name and d["bytes"] >= 32 << 20
    # 32 MiB at most CAP: busy for at least 0.5 s, and never faster than the cap while busy
    assert d["bytes_per_s_busy"] <= 1.1 * CAP, d
    assert list(doc) == ["run", "summary", "totals", "patterns", "layers", "checkpoints", "verdict"]
    assert doc["layers"] is None and doc["checkpoints"] == []


def test_ceiling_probe_never_writes_a_raw_device(loop_drive: Any) -> None:
    from iotune.errors import IotuneError
    from iotune.sweep.ceiling import probe_ceiling

    with pytest.raises(IotuneError) as e:
        probe_ceiling(loop_drive)
    assert str(e.value) == (f"--ceiling: {loop_drive.name} has no mounted filesystem, and probing the raw device "
                            f"would overwrite it; mount it, or sweep a directory on it (`iotune sweep --path DIR`)")


def test_a_sweep_journal_of_the_same_drive_gives_its_ceiling(drive: Any, tmp_path: Path) -> None:
    """The journal a `iotune sweep --path` on this drive would write (its drive identity: the
    filesystem UUID) is found from the traced device alone."""
    from iotune.blockdev.identity import drive_identity
    from iotune.model.journal import SweepEnv
    from iotune.model.sweep import Measurement, SweepPoint, Trial
    from iotune.sweep.ceiling import journal_ceiling
    from iotune.sweep.target import default_out
    from iotune.sweep.journal import open_journal

    identity = drive_identity(str(drive.mount_point))
    assert "filesystem_uuid" in identity
    out = tmp_path / default_out("default", identity, "fio")
    j = open_journal(out, fresh=False)
    j.start(SweepEnv(executor="fio", drive=identity))
    j.record(Trial("fio", SweepPoint(), 0, "ok", Measurement(41e6, 39e6)))
    found = journal_ceiling(drive.device, tmp_path / "iotune-sweeps")
    assert found is not None and found.read_bytes_per_s == 41e6 and found.write_bytes_per_s == 39e6
    assert found.source == f"sweep journal {out} (best of 1 fio trials)"
    assert journal_ceiling(drive.device, tmp_path / "elsewhere") is None
