"""The DeepSpeed configs each strategy generates (pure, no DeepSpeed needed)."""

from __future__ import annotations

import json

import pytest

from iotune.errors import UsageError
from iotune.model.aio import AioSettings
from iotune.model.attribution import categorize_swap_path
from iotune.workloads.presets import PRESETS, get_preset
from iotune.workloads.strategies import STRATEGIES, WorkloadSpec, ds_config


def test_nvme_opt_config() -> None:
    cfg = ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path="/mnt/swap"))
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and "offload_param" not in z
    assert z["offload_optimizer"] == {"device": "nvme", "nvme_path": "/mnt/swap", "pin_memory": False,
                                      "buffer_count": 4}
    assert cfg["aio"] == {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                          "single_submit": False, "overlap_events": True, "use_gds": False}
    assert "bf16" not in cfg


def test_aio_block_has_real_booleans_and_no_ignored_keys() -> None:
    text = json.dumps(AioSettings(block_size=524288).to_ds_json())
    assert '"single_submit": false' in text and '"false"' not in text and "num_threads" not in text


def test_nvme_all_uses_the_settings_that_work_on_deepspeed_0_19_8() -> None:
    cfg = ds_config(WorkloadSpec(strategy="nvme-all", nvme_path="/mnt/swap", precision="bf16"))
    z = cfg["zero_optimization"]
    assert cfg["bf16"] == {"enabled": True}
    assert z["stage3_prefetch_bucket_size"] == 0
    assert z["offload_param"]["device"] == "nvme" and z["offload_param"]["buffer_size"] == 10_000_000


def test_cpu_and_zenflow_offload_to_cpu() -> None:
    for strategy in ("cpu", "zenflow"):
        z = ds_config(WorkloadSpec(strategy=strategy))["zero_optimization"]
        assert z["stage"] == 2 and z["offload_optimizer"]["device"] == "cpu"
    zf = ds_config(WorkloadSpec(strategy="zenflow", zenflow_topk=0.1))["zero_optimization"]["zenflow"]
    assert zf["topk_ratio"] == 0.1 and zf["overlap_step"] is False


def test_baseline_uses_torch_adam() -> None:
    cfg = ds_config(WorkloadSpec(strategy="baseline"))
    assert cfg["zero_optimization"] == {"stage": 1} and cfg["optimizer"]["params"]["torch_adam"] is True


@pytest.mark.parametrize("spec,message", [
    (WorkloadSpec(strategy="bogus"), "unknown strategy 'bogus': choose one of baseline, cpu, nvme-opt, nvme-all, zenflow"),
    (WorkloadSpec(strategy="nvme-opt"), "strategy nvme-opt swaps to NVMe: give --nvme-path DIR"),
    (WorkloadSpec(strategy="zenflow", zenflow_topk=0), "--zenflow-topk is a fraction in (0, 1]"),
])
def test_bad_specs(spec: WorkloadSpec, message: str) -> None:
    with pytest.raises(UsageError) as e:
        ds_config(spec)
    assert str(e.value).startswith(message)


def test_every_strategy_is_described() -> None:
    assert list(STRATEGIES) == ["baseline", "cpu", "nvme-opt", "nvme-all", "zenflow"]


def test_tiny_preset_parameter_count() -> None:
    assert PRESETS["tiny"].param_count() == 3_688_704


def test_get_preset() -> None:
    assert get_preset("8b") is PRESETS["8b"] and get_preset("8b").hidden == 4096
    with pytest.raises(UsageError) as e:
        get_preset("70b")
    assert str(e.value) == "unknown --model '70b': choose one of tiny, small, medium, wide, 1b, 3b, 8b, 16b"


@pytest.mark.parametrize("path,category", [
    ("/m/zero_stage_3/optimizer/rank0/140.tensor.swp", "optimizer: fp32 master"),
    ("/m/zero_stage_3/optimizer/rank0/exp_avg-140.tensor.swp", "optimizer: exp_avg"),
    ("/m/zero_stage_3/optimizer/rank0/exp_avg_sq-140.tensor.swp", "optimizer: exp_avg_sq"),
    ("/m/zero_stage_3/optimizer/rank0/140_gradient_0_4096.tensor.swp", "gradients"),
    ("/m/zero_stage_3/bfloat16params/rank0/17_param.tensor.swp", "parameters"),
    ("/m/elsewhere/file.bin", "other"),
])
def test_swap_paths_are_categorized(path: str, category: str) -> None:
    assert categorize_swap_path(path) == category
