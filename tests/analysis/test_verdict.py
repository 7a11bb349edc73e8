"""The verdict: its rules on hand-built runs (exact figures, computed by hand
in the comments), its place in the console and JSON reports, and the ceiling
found in a sweep journal. Real traced runs are judged in test_verdict_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.device_use import busy_spans, overlap
from iotune.analysis.verdict import judge
from iotune.cli import cli
from iotune.model.run import TraceRun
from iotune.model.runfile import save_run
from iotune.model.verdict import (COMPUTE_BOUND, CPU_OPTIMIZER_BOUND, LIMITS, NO_TRAINING, NOT_ON_DEVICE,
                                  STARTUP_DOMINATED, STORAGE_BOUND, DeviceCeiling, TraceReport, Verdict,
                                  VerdictInputs)
from iotune.render.registry import render

from tests.records import offload_run
from tests.verdict_records import training_run

MiB = 1 << 20


def ceiling(bytes_per_s: float) -> VerdictInputs:
    return VerdictInputs(ceilings=(DeviceCeiling("loop0", bytes_per_s, "test ceiling"),))


def one(v: Verdict, kind: str, containing: str = "") -> dict[str, object]:
    found = [f for f in v.of_kind(kind) if containing in f.headline]
    assert len(found) == 1, [f.headline for f in v.findings]
    return found[0].figures


def test_storage_bound_step_by_hand() -> None:
    # steps of 50 + 50 + 400 ms; the optimizer's first 300 ms move 1 MiB each way per 10 ms
    v = judge(training_run(), ceiling(1e9))
    assert v.limit == STORAGE_BOUND and v.limit in LIMITS
    stall = one(v, "stall")
    assert stall["steps"] == 2                                              # steps 1 and 2 are steady
    assert stall["stall_s"] == pytest.approx(0.3) and stall["step_s"] == pytest.approx(0.5)
    assert stall["stall_share"] == pytest.approx(0.6)                       # 0.3 of 0.5 s
    assert stall["optimizer_stall_share"] == pytest.approx(0.75)            # 0.3 of 0.4 s
    limit = one(v, "limit")
    assert (limit["stall_s"], limit["optimizer_compute_s"], limit["forward_backward_compute_s"]) == \
        pytest.approx((0.3, 0.1, 0.1))
    assert v.summary.startswith("Storage-bound: 60% of the 0.50 s step waits on swap I/O")


def test_distance_is_bandwidth_while_busy() -> None:
    # 4 steps × 30 intervals × 2 MiB (read + write) = 240 MiB in 4 × 0.3 s busy, over a 2.0 s run
    d = one(judge(training_run(), ceiling(1e9)), "distance")
    assert d["bytes"] == 240 * MiB and d["busy_s"] == pytest.approx(1.2)
    assert d["bytes_per_s_busy"] == pytest.approx(240 * MiB / 1.2)           # 209.7 MB/s, not 125.8 over 2 s
    assert d["read_bytes_per_s_busy"] == pytest.approx(120 * MiB / 1.2)
    assert d["share_of_ceiling"] == pytest.approx(240 * MiB / 1.2 / 1e9)
    assert d["ceiling_source"] == "test ceiling"
    unknown = judge(training_run()).of_kind("distance")[0]
    assert unknown.figures["share_of_ceiling"] is None
    assert "ceiling is unknown — run `iotune report RUN --ceiling` or `iotune sweep --path …`" in unknown.headline


def test_advice_in_flight_against_littles_law() -> None:
    # 512 KiB requests at depth 4 keep 2 MiB in flight; 10 ms × 1 GB/s needs 10 MB
    v = judge(training_run(lat_ns=10_000_000), ceiling(1e9))
    a = one(v, "advice", "in flight")
    assert (a["request_bytes"], a["mean_depth"], a["in_flight_bytes"]) == (512 * 1024, 4.0, 2 * MiB)
    assert a["needed_in_flight_bytes"] == pytest.approx(1e7)
    assert "this drive needs ≥ 9.5 MiB in flight to reach its 1,000.0 MB/s" in v.of_kind("advice")[0].headline
    assert v.summary.endswith("raise aio queue_depth or block_size (iotune sweep --path NVME_PATH).")
    # at 1 ms the same 2 MiB is more than the 1 MB needed: the gap is elsewhere
    enough = one(judge(training_run(lat_ns=1_000_000), ceiling(1e9)), "advice", "in flight")
    assert enough["needed_in_flight_bytes"] == pytest.approx(1e6) and "not queue depth" in str(
        judge(training_run(lat_ns=1_000_000), ceiling(1e9)).of_kind("advice")[0].headline)
    # at 209.7 of a 220 MB/s ceiling (95%) the drive is saturated: more drives, not a deeper queue
    sat = judge(training_run(), ceiling(220e6))
    assert one(sat, "advice", "in flight")["action"] == "add drives (RAID0) or use a faster drive"
    assert one(judge(training_run()), "advice", "in flight")["action"] == "measure the drive's ceiling (--ceiling)"


def test_what_if_more_drives_uses_the_planner_arithmetic() -> None:
    # optimizer: 0.4 s, 0.3 s of it busy -> 0.1 s computing; it moves 60 MiB per step
    w = one(judge(training_run(), ceiling(1e9)), "advice", "RAID0")
    assert w["optimizer_bytes"] == pytest.approx(60 * MiB)
    assert w["optimizer_s_with_1_drives"] == pytest.approx(0.1 + 60 * MiB / 1e9)       # 0.1629 s
    assert w["optimizer_s_with_2_drives"] == pytest.approx(0.1 + 60 * MiB / 2e9)       # 0.1315 s
    assert w["optimizer_s_with_4_drives"] == pytest.approx(0.1 + 60 * MiB / 4e9)       # 0.1157 s
    # without a ceiling the bandwidth measured while busy stands in, and says so
    w2 = one(judge(training_run()), "advice", "RAID0")
    assert w2["drive_bytes_per_s"] == pytest.approx(240 * MiB / 1.2)
    assert "ceiling unknown" in str(w2["drive_bandwidth_source"])


def test_what_if_counts_the_drives_already_striped() -> None:
    # the same bytes over loop0 and loop1 in turn: two drives now, what-ifs at 4 and 8
    both = VerdictInputs(ceilings=tuple(DeviceCeiling(f"loop{i}", 1e9, "test") for i in range(2)))
    v = judge(training_run(drives=2), both)
    w = one(v, "advice", "RAID0")
    assert w["drives_now"] == 2 and "optimizer_s_with_1_drives" not in w
    assert w["optimizer_s_with_2_drives"] == pytest.approx(0.1 + 60 * MiB / 2e9)
    assert w["optimizer_s_with_8_drives"] == pytest.approx(0.1 + 60 * MiB / 8e9)
    assert [f.figures["device"] for f in v.of_kind("distance")] == ["loop0", "loop1"]
    assert one(v, "stall")["stall_s"] == pytest.approx(0.3)              # busy on either drive counts


def test_cpu_optimizer_and_compute_bound() -> None:
    v = judge(training_run(io=100))          # optimizer 0.4 s, 0.1 s of it busy: 0.3 s computing
    assert v.limit == CPU_OPTIMIZER_BOUND and not v.of_kind("advice")
    assert v.summary.startswith("CPU-optimizer-bound: the optimizer step computes for 0.30 s of the 0.50 s step")
    c = judge(training_run(fwd=200, bwd=200, opt=100, io=50))   # forward + backward 0.4 of 0.5 s
    assert c.limit == COMPUTE_BOUND and not c.of_kind("advice")
    assert one(c, "limit")["forward_backward_compute_s"] == pytest.approx(0.4)


def test_startup_dominated_still_names_the_step_limit() -> None:
    # 9 s before the first step, 4 steps of 0.5 s: the steps are 2 of 11 s (18% < 20%)
    v = judge(training_run(lead_ms=9000))
    assert v.limit == STARTUP_DOMINATED
    limit = one(v, "limit")
    assert limit["step_limit"] == STORAGE_BOUND and limit["steps_share_of_run"] == pytest.approx(2 / 11)
    assert v.summary.startswith("Start-up dominated (steps are 18% of the run); storage-bound:")
    assert judge(training_run(lead_ms=7000)).limit == STORAGE_BOUND                    # 2 of 9 s: 22%


def test_gaps_between_bursts_count_as_busy_up_to_the_bridge() -> None:
    # bursts every 100 ms (as the blkio throttle releases them) in the optimizer's first 300 ms:
    # intervals at 0, 100, 200 ms, gaps of 90 ms bridged: busy from 0 to 210 ms
    assert one(judge(training_run(burst_ms=100)), "stall")["stall_s"] == pytest.approx(0.21)
    # gaps of 190 ms are not: two 10 ms intervals
    assert one(judge(training_run(burst_ms=200)), "stall")["stall_s"] == pytest.approx(0.02)
    spans = busy_spans(training_run(burst_ms=100, steps=1), bridge_s=0.15)
    assert spans == [pytest.approx((0.1, 0.31))] and overlap(spans, 0.0, 0.2) == pytest.approx(0.1)


def test_swap_elsewhere_is_not_judged_on_the_traced_device() -> None:
    v = judge(training_run(on_device=False))
    assert v.limit == NOT_ON_DEVICE and not v.of_kind("stall") and not v.of_kind("advice")
    figures = one(v, "limit")
    assert figures["swap_bytes"] == 2 * 60 * MiB and figures["block_bytes"] == 0
    assert "trace the device holding nvme_path" in v.summary


def test_no_training_gets_no_made_up_bottleneck() -> None:
    v = judge(offload_run())                  # fio: no phases recorded
    assert v.limit == NO_TRAINING
    assert not v.of_kind("stall") and not v.of_kind("advice")
    assert v.summary == ("No training verdict: no training phases were recorded (not a Python/DeepSpeed job, "
                         "or traced with --no-inject).")
    assert one(v, "distance")["device"] == "loop0"             # what the device did is still stated


def test_console_report_opens_with_the_verdict() -> None:
    run = training_run()
    text = render(TraceReport(run, judge(run, ceiling(1e9))), "console")
    lines = text.splitlines()
    verdict_at = next(i for i, line in enumerate(lines) if line.startswith("Verdict: Storage-bound"))
    assert verdict_at == 2                                     # right under the header line
    table_at = next(i for i, line in enumerate(lines) if line.startswith("Block requests per device"))
    assert verdict_at < table_at
    for label in ("stall", "device", "limit", "to do", "wear"):
        assert any(line.lstrip().startswith(label + "  ") for line in lines[verdict_at:table_at]), label
    assert "Verdict" not in render(run, "console")             # the bare run renders as before


def test_json_report_keeps_its_keys_and_adds_the_verdict() -> None:
    run = training_run()
    v = judge(run, ceiling(1e9))
    doc = json.loads(render(TraceReport(run, v), "json"))
    assert list(doc) == ["run", "summary", "totals", "patterns", "layers", "checkpoints", "verdict"]
    assert doc["layers"] is None                      # no application layer traced (trace --app)
    assert doc["verdict"] == v.to_json() and Verdict.from_json(doc["verdict"]) == v
    assert doc["verdict"]["limit"] == STORAGE_BOUND and all(f["rule"] for f in doc["verdict"]["findings"])
    assert json.loads(render(TraceReport(run), "json"))["verdict"] is None
    assert list(json.loads(render(run, "json"))) == ["run", "summary", "totals", "patterns", "layers", "checkpoints"]


def test_report_cli_judges_a_saved_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)                      # no ./iotune-sweeps here
    save_run(training_run(), tmp_path / "r")
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "r"), "--json", "--drive-tbw", "600TB"])
    assert r.exit_code == 0, r.output
    v = Verdict.from_json(json.loads(r.stdout)["verdict"])
    assert v.limit == STORAGE_BOUND
    assert one(v, "endurance")["tbw_source"] == "--drive-tbw"
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "r"), "--drive-tbw", "lots"])
    assert r.exit_code == 2 and "'lots' is not a size" in r.output


def test_journal_of_the_same_drive_gives_the_ceiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from iotune.blockdev.devices import BlockDevice
    from iotune.model.journal import SweepEnv
    from iotune.model.sweep import Measurement, SweepPoint, Trial
    from iotune.sweep import ceiling as ceiling_mod
    from iotune.sweep.journal import open_journal

    def journal(name: str, drive: dict[str, object], trials: list[tuple[str, float, float]]) -> None:
        j = open_journal(tmp_path / name, fresh=False)
        j.start(SweepEnv(executor="fio", drive=drive))
        for i, (executor, r, w) in enumerate(trials):
            j.record(Trial(executor, SweepPoint(queue_depth=i + 1), 0, "ok", Measurement(r, w)))

    journal("default-fio-aaaaaaaa", {"filesystem_uuid": "uuid-1"},
            [("fio", 100e6, 300e6), ("fio", 200e6, 200e6), ("steps", 900e6, 900e6)])
    journal("default-fio-bbbbbbbb", {"filesystem_uuid": "uuid-2"}, [("fio", 900e6, 900e6)])
    monkeypatch.setattr(ceiling_mod, "device_identities", lambda dev: ("uuid-1", {"7:0 1 bytes"}))
    found = ceiling_mod.journal_ceiling(BlockDevice(7, 0, "loop0"), tmp_path)
    assert found is not None
    # the best fio trial by the sweep's score, the harmonic mean: 200 MB/s beats 2/(1/100 + 1/300) = 150
    assert (found.device, found.bytes_per_s, found.read_bytes_per_s) == ("loop0", 200e6, 200e6)
    assert found.source == f"sweep journal {tmp_path / 'default-fio-aaaaaaaa'} (best of 2 fio trials)"
    monkeypatch.setattr(ceiling_mod, "device_identities", lambda dev: ("uuid-9", {"7:0 1 bytes"}))
    assert ceiling_mod.journal_ceiling(BlockDevice(7, 0, "loop0"), tmp_path) is None


RECORDED = Path(__file__).parents[1] / "data" / "run-nvme-opt-capped"


def test_recorded_capped_run_is_storage_bound_at_the_cap() -> None:
    """A real trace: the tiny workload, nvme-opt, 8 steps on a loop drive capped at
    60 MB/s per direction (tests/analysis/test_verdict_e2e.py records such runs afresh)."""
    from iotune.analysis.attribution import steady, step_breakdowns
    from iotune.model.runfile import load_run

    run = load_run(RECORDED)
    v = judge(run, VerdictInputs(ceilings=(DeviceCeiling("loop4", 60e6, "the cap"),)))
    assert v.limit == STORAGE_BOUND
    stall = one(v, "stall")
    # the optimizer step moves 46.4 MB each way per step: at 60 MB/s at least 0.77 s; it took
    # 1.480 s (median), 1.470 s of it with I/O in flight
    assert (round(stall["optimizer_s"], 3), round(stall["optimizer_stall_s"], 3)) == (1.480, 1.470)
    opt_bytes = [r.block_by_phase["optimizer"] for r in steady(step_breakdowns(run))]
    assert all(w.read_bytes == 12 * 3_688_704 + 2_097_152 for w in opt_bytes)   # optimizer state + gradients
    d = one(v, "distance")      # 63.1 MB/s while busy in the median of steps 1-6, over the cap: shown at most 100%
    assert round(d["steady_bytes_per_s_busy"] / 60e6, 2) == 1.05 and d["share_of_ceiling"] == 1.0
    assert one(v, "advice", "in flight")["action"] == "add drives (RAID0) or use a faster drive"
    what_if = one(v, "advice", "RAID0")
    # 0.004 s computing + 92,732,416 B / (2 × 60 MB/s)
    assert what_if["optimizer_s_with_2_drives"] == pytest.approx(0.00415 + 92_732_416 / 120e6, abs=1e-4)


def _roundtrip(run: TraceRun) -> TraceRun:
    return TraceRun.from_json(json.loads(json.dumps(run.to_json())))


def test_device_size_is_recorded_and_older_runs_load() -> None:
    run = training_run()
    assert _roundtrip(run).devices[0].size_bytes == 1 << 30
    old = run.to_json()
    del old["devices"][0]["size_bytes"]
    assert TraceRun.from_json(old).devices[0].size_bytes == 0
