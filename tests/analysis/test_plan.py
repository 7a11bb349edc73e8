"""The planner: hand-computed cases, properties, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from iotune.analysis.calibration import check
from iotune.analysis.planner import make_plan, traffic
from iotune.cli import cli
from iotune.model.plan import PlanInput, Traffic
from iotune.model.runfile import save_run
from iotune.workloads.presets import PRESETS, swappable_params

from tests.records import attributed_run

B16 = PRESETS["16b"].param_count()


def test_16b_nvme_opt_by_hand() -> None:
    plan = make_plan(PlanInput(params=B16, strategy="nvme-opt", drive_bytes_per_s=3e9, drives=3, target_step_s=10))
    assert B16 == 15_847_060_480
    assert plan.nvme_capacity_bytes == 16 * B16                      # master 4 + moments 8 + gradient files 4
    assert plan.per_optimizer_step.total_read == 16 * B16            # 12 B state + 4 B gradients
    assert plan.per_optimizer_step.total_write == 16 * B16
    assert plan.storage_s_per_step == pytest.approx(32 * B16 / 9e9)
    assert plan.bandwidth_for_target == pytest.approx(32 * B16 / 10)
    assert plan.drives_for_target == 17                              # 50.7 GB/s / 3 GB/s
    mem = plan.memory
    assert sum(mem["GPU"].values()) == 4 * B16
    assert mem["CPU"]["gradient partitions"] == 2 * B16                 # bf16: the accumulation dtype is the model's
    assert mem["NVMe"] == {"master weights": 4 * B16, "Adam moments": 8 * B16, "gradients (fp32)": 4 * B16}


def test_18_bytes_per_parameter_in_all() -> None:
    p = 1_000_000
    mem = make_plan(PlanInput(params=p, strategy="baseline")).memory
    assert sum(mem["GPU"].values()) == 18 * p


def test_nvme_all_adds_parameter_traffic() -> None:
    p = 1 << 30                                 # 8 tensors of 128 Mi elements, each over the 1 MiB threshold
    t = traffic(PlanInput(params=p, strategy="nvme-all", precision="bf16"))
    assert t.read["parameters"] == 4 * p and t.write["parameters"] == 2 * p


def test_a_model_too_small_to_swap_moves_nothing() -> None:
    """DeepSpeed keeps a tensor under max(1 MiB, block_size) in RAM: 1,000
    parameters are one tensor of 4 KB, so nothing crosses the drive (the
    model plan shares with `sweep offload` and `lint`)."""
    t = traffic(PlanInput(params=1000, strategy="nvme-opt"))
    assert t.total_read == t.total_write == 0


def test_tiny_swappable_gradients_match_the_trace() -> None:
    assert swappable_params(PRESETS["tiny"]) * 4 == 2_097_152          # embed + lm_head, 1 MiB each
    assert swappable_params(PRESETS["small"]) * 4 == 54_788_096


@given(st.integers(1, 10**12), st.integers(1, 10**12), st.sampled_from(["nvme-opt", "nvme-all"]))
def test_traffic_grows_with_parameters(a: int, b: int, strategy: str) -> None:
    lo, hi = sorted((a, b))
    t_lo, t_hi = traffic(PlanInput(params=lo, strategy=strategy)), traffic(PlanInput(params=hi, strategy=strategy))
    assert t_lo.total_read <= t_hi.total_read and t_lo.total_write <= t_hi.total_write
    if hi >= lo + (1 << 20) and lo >= 1 << 20:           # a 1 MiB tensor's worth more: more bytes
        assert t_lo.total_read < t_hi.total_read and t_lo.total_write < t_hi.total_write


@given(st.integers(1, 1000), st.sampled_from(["fp32", "bf16"]))
def test_swap_traffic_per_parameter(tensors: int, precision: str) -> None:
    """nvme-opt: 12 B of optimizer state + 4 B of gradients each way; nvme-all
    adds the weights, read twice (forward, backward) and written once. (A
    parameter count is cut into tensors of 128 Mi elements: whole ones here,
    so no padding.)"""
    params = tensors << 27
    w = 4 if precision == "fp32" else 2
    opt = traffic(PlanInput(params=params, strategy="nvme-opt", precision=precision))
    assert (opt.total_read, opt.total_write) == (16 * params, 16 * params)
    everything = traffic(PlanInput(params=params, strategy="nvme-all", precision=precision))
    assert (everything.total_read, everything.total_write) == ((16 + 2 * w) * params, (16 + w) * params)


@given(st.integers(1, 10**12), st.sampled_from(["cpu", "zenflow", "baseline"]), st.floats(0.01, 1.0))
def test_strategies_without_nvme_move_nothing_to_it(params: int, strategy: str, topk: float) -> None:
    inp = PlanInput(params=params, strategy=strategy, zenflow_topk=topk, drive_bytes_per_s=3e9, drives=2,
                    target_step_s=1.0)
    assert traffic(inp) == Traffic({}, {})
    plan = make_plan(inp)
    assert plan.nvme_capacity_bytes == 0 and plan.memory["NVMe"] == {}
    assert plan.storage_s_per_step == 0.0 and plan.bandwidth_for_target is None and plan.drives_for_target is None
    assert ("No NVMe traffic" in plan.bottleneck) == (strategy != "baseline")


@given(st.integers(1, 700), st.integers(1, 64))
def test_storage_time_is_bytes_over_striped_bandwidth(tensors: int, drives: int) -> None:
    params = tensors << 27
    one = make_plan(PlanInput(params=params, drive_bytes_per_s=2e9, drives=drives))
    more = make_plan(PlanInput(params=params, drive_bytes_per_s=2e9, drives=drives + 1))
    assert one.storage_s_per_step == pytest.approx(32 * params / (2e9 * drives))
    assert more.storage_s_per_step is not None and one.storage_s_per_step is not None
    assert more.storage_s_per_step < one.storage_s_per_step


def test_check_against_a_hand_built_trace() -> None:
    run = attributed_run()      # 4 MB per optimizer tensor per step
    plan = make_plan(PlanInput(params=1_000_000))
    rows = {(r.category, r.direction): r for r in check(plan, run)}
    assert rows[("optimizer: exp_avg", "write")].predicted_bytes == 4 * 1_000_192      # padded to 256 elements
    assert rows[("optimizer: exp_avg", "write")].error_pct == pytest.approx(100 * 768 / 4_000_000)
    assert rows[("gradients", "read")].measured_bytes == 0


def test_plan_cli_and_bad_input(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["plan", "--model", "16b", "--drive-bandwidth", "3GB/s", "--drives", "3", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["nvme_capacity_bytes"] == 12 * B16 + 4 * swappable_params(PRESETS["16b"])   # norms: no gradient file
    assert doc["inp"]["swappable_params"] == swappable_params(PRESETS["16b"])
    r = CliRunner().invoke(cli, ["plan"])
    assert r.exit_code == 2 and r.stderr == "Error: give the model as --model PRESET or --params N (one of them)\n"
    r = CliRunner().invoke(cli, ["plan", "--params", "-5"])
    assert r.exit_code == 2 and "Invalid value for '--params'" in r.stderr
    r = CliRunner().invoke(cli, ["plan", "--params", "1000", "--drives", "0"])
    assert r.exit_code == 2 and "Invalid value for '--drives'" in r.stderr
    r = CliRunner().invoke(cli, ["plan", "--params", "1000", "--drive-bandwidth", "fast"])
    assert r.exit_code == 2 and "'fast' is not a rate: use e.g. 3GB/s" in r.stderr
    save_run(attributed_run(), tmp_path / "run")
    r = CliRunner().invoke(cli, ["plan", "--params", "1000000", "--check", str(tmp_path / "run")])
    assert r.exit_code == 0 and "Prediction vs trace" in r.stdout
