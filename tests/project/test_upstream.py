"""iotune's copies of other projects' numbers, checked against the installed
packages: DeepSpeed's aio and offload-buffer defaults, and the parameter
counts of transformers' LlamaForCausalLM for every preset."""

from __future__ import annotations


import pytest

from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS, OffloadBuffers
from iotune.workloads.presets import PRESETS, tensor_numels

from tests.conftest import needs_deepspeed



@needs_deepspeed
def test_aio_defaults_are_deepspeeds() -> None:
    """DeepSpeed's get_aio_config is what the engine reads its `aio` block with:
    with no block it returns its defaults, with an empty one each key's default."""
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config

    ours = DEEPSPEED_AIO_DEFAULTS.to_ds_json()
    for ds_config in ({}, {"aio": {}}):
        theirs = get_aio_config(ds_config)
        assert theirs == ours
        assert {k: type(v) for k, v in theirs.items()} == {k: type(v) for k, v in ours.items()}  # bool is not int


@needs_deepspeed
def test_offload_buffer_defaults_are_deepspeeds() -> None:
    """Buffer counts and sizes are DeepSpeed's; pin_memory is not (DeepSpeed
    pins by default, iotune does not, so a sweep never hits `ulimit -l`)."""
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)

    param, opt = DeepSpeedZeroOffloadParamConfig(), DeepSpeedZeroOffloadOptimizerConfig()
    ours = OffloadBuffers()
    assert (ours.param_buffer_count, ours.param_buffer_size) == (param.buffer_count, param.buffer_size)
    assert ours.optimizer_buffer_count == opt.buffer_count
    assert (ours.pin_memory, param.pin_memory, opt.pin_memory) == (False, True, True)


@needs_deepspeed
@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_counts_are_transformers_llama(name: str) -> None:
    """Built on the meta device: shapes only, no memory. The 1b-16b presets
    use grouped-query attention (kv_heads < heads)."""
    import torch
    from transformers import LlamaForCausalLM

    from iotune.workloads.train import llama_config

    shape = PRESETS[name]
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(shape))
    numels = [p.numel() for p in model.parameters()]
    assert tensor_numels(shape) == numels
    assert shape.param_count() == sum(numels)


def test_the_big_presets_exercise_grouped_query_attention() -> None:
    assert [n for n, s in PRESETS.items() if s.kv_heads < s.heads] == ["medium", "1b", "3b", "8b", "16b"]
