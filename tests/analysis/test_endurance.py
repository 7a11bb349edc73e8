"""SSD endurance: the arithmetic by hand on a recorded run and on a plan,
and the drive's wear read from SMART / NVMe health data."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.endurance import run_endurance
from iotune.blockdev.smart import DriveWear, parse_nvme_cli, parse_smartctl
from iotune.cli import cli
from iotune.model.runfile import load_run
from iotune.model.verdict import VerdictInputs

from tests.records import offload_run
from tests.verdict_records import training_run

# training_run(): 4 steps of 0.5 s; each optimizer step writes 30 × 1 MiB = 31,457,280 B on loop0 (1 GiB).
# Steady steps 1 and 2: 62,914,560 B in 1.0 s -> 62,914,560 B/s
#   per hour: 62,914,560 × 3,600  = 226,492,416,000 B      (226.49 GB)
#   per day:  62,914,560 × 86,400 = 5,435,817,984,000 B    (5.44 TB)
#   drive writes per day on 1 GiB: 5,435,817,984,000 / 1,073,741,824 = 5,062.5
#   per TB of capacity: 5.435817984
#   600 TB rated: 600e12 / 5,435,817,984,000 = 110.379 days; 100 TB already written: 500e12 / ... = 91.983 days
PER_DAY = 5_435_817_984_000


def test_endurance_of_a_recorded_run_by_hand() -> None:
    f = run_endurance(training_run(), VerdictInputs(drive_tbw_bytes=600e12, tbw_source="--drive-tbw"))
    assert f is not None and f.kind == "endurance"
    fig = f.figures
    assert fig["written_bytes_per_hour"] == pytest.approx(226_492_416_000)
    assert fig["written_bytes_per_day"] == pytest.approx(PER_DAY)
    assert fig["capacity_bytes"] == 1 << 30 and fig["drive_writes_per_day"] == pytest.approx(5062.5)
    assert fig["drive_writes_per_day_per_tb"] == pytest.approx(5.435817984)
    assert fig["days_to_tbw"] == pytest.approx(600e12 / PER_DAY) and round(fig["days_to_tbw"], 3) == 110.379
    assert f.headline == ("226.49 GB written per hour of training on loop0; 5,062.50 drive writes per day on its "
                          "1.07 GB; the rated 600.00 TB (--drive-tbw) lasts 110 days of writing around the clock.")
    assert "2 steady step(s): 62.9 MB written in 1.00 s" in f.rule


RECORDED = Path(__file__).parents[1] / "data" / "run-nvme-opt-capped"


def test_endurance_of_a_real_recorded_run_by_hand() -> None:
    """A real trace (iotune 2026-11-23): 8 steps of the built-in tiny workload, nvme-opt,
    on a 1 GiB ext4 loop drive capped at 60 MB/s per direction."""
    # steady steps 1-6 (all but the first and last), from the run's phases and 10 ms timeline:
    #   written 46,370,816 + 46,407,680 + 46,370,816 + 46,428,160 + 46,370,816 + 46,370,816 = 278,319,104 B
    #   in 2.082980135 + 2.511754179 + 2.687759208 + 2.296351828 + 1.962979964 + 1.995360042 = 13.537185356 s
    #   -> 278,319,104 / 13.537185356 = 20,559,599.11 B/s
    #   per hour: × 3,600 = 74,014,556,797 B (74.01 GB); per day: × 86,400 = 1,776,349,363,122 B (1.78 TB)
    #   on the 1 GiB drive (1,073,741,824 B, recorded by the trace): 1,654.35 drive writes per day
    #   600 TB rated: 600e12 / 1,776,349,363,122 = 337.77 days
    f = run_endurance(load_run(RECORDED), VerdictInputs(drive_tbw_bytes=600e12, tbw_source="--drive-tbw"))
    assert f is not None
    assert f.figures["written_bytes_per_hour"] == pytest.approx(74_014_556_797, abs=1)
    assert f.figures["written_bytes_per_day"] == pytest.approx(1_776_349_363_122, abs=1)
    assert f.figures["capacity_bytes"] == 1_073_741_824
    assert round(f.figures["drive_writes_per_day"], 2) == 1654.35      # type: ignore[arg-type]
    assert round(f.figures["days_to_tbw"], 2) == 337.77                 # type: ignore[arg-type]
    assert f.headline == ("74.01 GB written per hour of training on loop4; 1,654.35 drive writes per day on its "
                          "1.07 GB; the rated 600.00 TB (--drive-tbw) lasts 338 days of writing around the clock.")


def test_already_written_and_capacity_override() -> None:
    inputs = VerdictInputs(drive_tbw_bytes=600e12, tbw_source="SMART", drive_written_bytes=100e12,
                           drive_capacity_bytes=2e12)
    fig = run_endurance(training_run(), inputs).figures     # type: ignore[union-attr]
    assert fig["days_to_tbw"] == pytest.approx(500e12 / PER_DAY)            # 91.983 days
    assert fig["drive_writes_per_day"] == pytest.approx(PER_DAY / 2e12)      # 2.718 on a 2 TB drive


def test_unknown_endurance_and_capacity_are_said() -> None:
    run = training_run()
    run = replace(run, devices=tuple(replace(d, size_bytes=0) for d in run.devices))
    f = run_endurance(run, VerdictInputs())
    assert f is not None and f.figures["drive_writes_per_day"] is None and f.figures["days_to_tbw"] is None
    assert f.headline.endswith("5.44 drive writes per day per TB of capacity; rated endurance unknown: pass "
                               "--drive-tbw (e.g. --drive-tbw 600TB).")


def test_a_run_without_steps_uses_its_whole_duration() -> None:
    # offload_run: loop0 wrote 29 × 512 KiB + 3 × 4 KiB = 15,216,640 B in 2.0 s -> 7,608,320 B/s
    f = run_endurance(offload_run(), VerdictInputs())
    assert f is not None
    assert f.figures["written_bytes_per_hour"] == pytest.approx(7_608_320 * 3600)     # 27.39 GB
    assert "at this run's rate" in f.headline and "the whole run: 15.2 MB written in 2.00 s" in f.rule
    assert run_endurance(replace(offload_run(), devices=()), VerdictInputs()) is None


def test_plan_endurance_by_hand() -> None:
    # 1e9 parameters, nvme-opt: 16 B written per parameter per optimizer step = 16 GB, every 10 s: 1.6 GB/s
    #   per hour 5.76 TB; per day 138.24 TB; on 2 TB: 69.12 drive writes per day; 600 TB last 4.34 days
    r = CliRunner().invoke(cli, ["plan", "--params", "1000000000", "--strategy", "nvme-opt", "--step-time", "10",
                                 "--drive-tbw", "600TB", "--drive-capacity", "2TB", "--json"])
    assert r.exit_code == 0, r.output
    fig = json.loads(r.stdout)["endurance"]["figures"]
    assert fig["written_bytes_per_hour"] == pytest.approx(5.76e12)
    assert fig["drive_writes_per_day"] == pytest.approx(69.12)
    assert fig["days_to_tbw"] == pytest.approx(600e12 / 138.24e12)
    text = CliRunner().invoke(cli, ["plan", "--params", "1000000000", "--drive-bandwidth", "3.2GB/s"]).stdout
    # no --step-time: the storage time, 32 GB / 3.2 GB/s = 10 s, bounds the step from below
    assert ("Endurance: 5.76 TB written per hour of training per drive; 138.24 drive writes per day per TB of "
            "capacity; rated endurance unknown") in text
    cpu = json.loads(CliRunner().invoke(cli, ["plan", "--params", "1000", "--strategy", "cpu", "--json"]).stdout)
    assert cpu["endurance"] is None


SMARTCTL_NVME = {"device": {"name": "/dev/nvme0", "protocol": "NVMe"},
                 "nvme_smart_health_information_log": {"percentage_used": 4, "data_units_written": 46_875_000}}
SMARTCTL_ATA = {"logical_block_size": 512, "endurance_used": {"current_percent": 10},
                "ata_smart_attributes": {"table": [{"id": 241, "name": "Total_LBAs_Written",
                                                    "value": 99, "raw": {"value": 117_187_500_000}}]}}


def test_wear_from_health_data() -> None:
    # NVMe: 46,875,000 data units × 512,000 B = 24 TB written at 4% used -> 600 TB rated
    nvme = parse_smartctl(SMARTCTL_NVME, "nvme0n1")
    assert nvme == DriveWear("nvme0n1", 24e12, 4.0, "smartctl") and nvme.tbw_bytes == pytest.approx(600e12)
    assert nvme.source == "estimated from nvme0n1's health data (smartctl): 24.00 TB written, 4% of rated " \
                          "endurance used"
    # ATA: 117,187,500,000 LBAs × 512 B = 60 TB at 10% used -> 600 TB
    assert parse_smartctl(SMARTCTL_ATA, "sda").tbw_bytes == pytest.approx(600e12)    # type: ignore[union-attr]
    assert parse_nvme_cli({"data_units_written": 46_875_000, "percent_used": 4}, "nvme0n1").tbw_bytes == \
        pytest.approx(600e12)                                                          # type: ignore[union-attr]
    # under 1% used there is no estimate, and a disk without health data gives none
    assert DriveWear("x", 1e12, 0.0, "smartctl").tbw_bytes is None
    assert parse_smartctl({"device": {"protocol": "ATA"}}, "vda") is None
