"""The dtype the startup hook reports at deepspeed.initialize (`iotune sweep
--offload` sizes a user's job's parameter buffers by it), decided as
DeepSpeed 0.19.8 decides it, on every kind of CPU: the accelerator's fp16
support is an input here, not this machine's answer. The real runs, in
each precision, are tests/model/test_offload_memory.py's."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from iotune.trace.attribution import INJECT_DIR


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(INJECT_DIR))
    import _iotune_hooks

    yield _iotune_hooks
    for name in ("_iotune_hooks", "_iotune_ckpt"):
        sys.modules.pop(name, None)


def model(dtype: str, zero_init: bool = False) -> Any:
    param = SimpleNamespace(dtype=dtype)
    if zero_init:
        param.ds_tensor = SimpleNamespace(dtype=dtype)
    return SimpleNamespace(parameters=lambda: iter([param]))


# (config's precision, the model's dtype, fp16 supported) -> partition dtype
@pytest.mark.parametrize("precision,built,fp16,expected", [
    (None, "torch.float32", False, "bf16"),          # an AVX2-only CPU: bf16 even from fp32
    ("bf16", "torch.float32", False, "bf16"),
    (None, "torch.float32", True, "fp32"),           # AVX512-FP16 or AMX-FP16: the model's dtype is kept
    ("bf16", "torch.float32", True, "bf16"),         # the engine casts to bf16 first
    ("fp16", "torch.float32", True, "fp16"),
    (None, "torch.bfloat16", True, "bf16"),
])
def test_outside_zero_init_the_engines_cast_then_the_accelerator_decide(
        hooks: ModuleType, precision: str | None, built: str, fp16: bool, expected: str) -> None:
    assert hooks._partition_dtype(model(built), precision, lambda: fp16) == expected


@pytest.mark.parametrize("fp16", [False, True])
def test_under_zero_init_the_partitions_own_dtype_is_reported(hooks: ModuleType, fp16: bool) -> None:
    def not_asked() -> bool:
        raise AssertionError("the accelerator is not asked about a model built under deepspeed.zero.Init")

    assert hooks._partition_dtype(model("torch.float32", zero_init=True), "bf16", not_asked) == "fp32"
    assert hooks._partition_dtype(SimpleNamespace(parameters=lambda: iter([])), None, not_asked) is None


def test_the_config_is_read_where_initialize_reads_it(hooks: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}}))
    read = hooks._config_precision
    assert read((), {"config": {"fp16": {"enabled": True}}}) == "fp16"
    assert read((), {"config_params": {"bfloat16": {"enabled": True}}}) == "bf16"
    assert read((), {"config": str(path)}) == "bf16"
    assert read((Namespace(deepspeed_config=str(path)),), {}) == "bf16"
    assert read((), {"args": Namespace(deepspeed_config=str(path))}) == "bf16"
    assert read((), {"config": {"bf16": {"enabled": False}, "fp16": {"enabled": "auto"}}}) is None
    assert read((), {"config": str(tmp_path / "missing.json")}) is None
    assert read((), {}) is None
