"""The checkpoint model (iotune/model/checkpoint.py) against DeepSpeed 0.19.8's
own saves: real save_checkpoint calls of the built-in workload, traced by
the startup hook, hold per part exactly the bytes the model predicts before
anything runs. A torch.save file's payload is the sum of its zip archive's
data records (the tensors' bytes), beside a little pickle and framing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from iotune.model.checkpoint import (CheckpointBytes, WriterSettings, checkpoint_bytes, io_buffer_problem,
                                     keep_that_fits, offloaded_elements)
from iotune.model.checkpoint_io import LATEST, MODEL_STATES, OFFLOADED, OPTIMIZER_STATES, RECOVERY
from iotune.model.hook_events import hook_env, read_events
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.resources import inject_dir
from iotune.workloads.presets import PRESETS, tensor_numels

from tests.conftest import needs_deepspeed

TINY = JobShape(tuple(tensor_numels(PRESETS["tiny"])))


def test_the_offloaded_copy_is_12_bytes_a_swapped_parameter() -> None:
    nvme = OffloadKnobs(optimizer_device="nvme")
    b = checkpoint_bytes(nvme, TINY, "global_step2")
    assert sum(TINY.numels) == 3_688_704
    assert b.per_rank == {MODEL_STATES: 0, OFFLOADED: 12 * 3_688_704, OPTIMIZER_STATES: 0}
    assert b.rank0_only == {RECOVERY: 38_580 + 2_490, LATEST: len("global_step2")}
    # sub-groups of 1 M elements: the three-tensor tail group (2.0 MiB) is swapped, all of it
    small = OffloadKnobs(optimizer_device="nvme", sub_group_size=1_000_000)
    assert offloaded_elements(small, TINY) == 3_688_704
    # a 16 MiB aio block keeps every sub-group under 16 MiB in RAM: its state goes to the optimizer file
    big_block = OffloadKnobs(optimizer_device="nvme", sub_group_size=1_000_000, block_size=16 << 20)
    assert checkpoint_bytes(big_block, TINY).per_rank[OFFLOADED] == 0
    assert checkpoint_bytes(big_block, TINY).per_rank[OPTIMIZER_STATES] == 12 * 3_688_704


def test_model_states_are_parameters_times_the_dtype_below_zero_3() -> None:
    b = checkpoint_bytes(OffloadKnobs(stage=2, optimizer_device="cpu", dtype="bf16"), JobShape(TINY.numels, ranks=4))
    assert b.rank0_only[MODEL_STATES] == 2 * 3_688_704                  # data-parallel rank 0 only
    assert b.per_rank[OPTIMIZER_STATES] == 12 * 922_176                 # 1/4 of the parameters each
    assert b.total_bytes == 2 * 3_688_704 + 4 * 12 * 922_176 + 38_580 + 2_490 + len("global_step1")
    assert isinstance(b, CheckpointBytes) and b.part(OPTIMIZER_STATES) == 12 * 3_688_704


def test_writer_blocks_read_the_way_deepspeed_reads_them() -> None:
    assert WriterSettings.from_ds_config({}) == WriterSettings()
    assert WriterSettings.from_ds_config({"checkpoint": {"writer": {}}}).kind == "fast"     # the default type
    w = WriterSettings.from_ds_config({"checkpoint": {"writer": {"type": "FAST", "io_buffer_size": 1 << 20,
                                                                  "io_buffer_double": False, "decoupled": True}}})
    assert (w.kind, w.io_buffer_size, w.io_buffer_double, w.decoupled) == ("fast", 1 << 20, False, True)
    assert WriterSettings("fast", 8 << 20).to_ds_json() == {"type": "fast", "io_buffer_size": 8 << 20,
                                                            "io_buffer_double": True, "io_multiplier": 1}
    assert WriterSettings().to_ds_json() is None
    assert io_buffer_problem(64 << 20, True, 1) is None
    assert "multiple of 1,024 B" in (io_buffer_problem(1_000_000, True, 1) or "")
    assert io_buffer_problem(999_936, False, 1) is None and io_buffer_problem(999_936, True, 1)   # 1953 x 512
    assert "multiple of 4,096 B" in (io_buffer_problem(2048 * 3, True, 4) or "")


def test_keep_that_fits_leaves_the_swap_space() -> None:
    assert keep_that_fits(100e9, 40e9, 15e9) == 4
    assert keep_that_fits(30e9, 40e9, 15e9) == 0


# -- real saves ---------------------------------------------------------------------

def payload(path: Path) -> int:
    """Tensor bytes in a torch.save file (its zip archive's data records)."""
    with zipfile.ZipFile(path) as z:
        return sum(i.file_size for i in z.infolist() if "/data/" in i.filename)


def _save(tmp_path: Path, strategy: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A save of the built-in tiny model in fp32, whatever the CPU (--precision auto picks bf16 where the CPU
    has native bf16, and the knobs below predict fp32 model states)."""
    swap, ckpt, events = tmp_path / "swap", tmp_path / "ckpt", tmp_path / "events"
    swap.mkdir()
    events.mkdir()
    env = hook_env(dict(os.environ), inject_dir(), events)
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", strategy,
                        "--size", "tiny", "--precision", "fp32", "--nvme-path", str(swap), "--steps", "2",
                        "--save-at", "1",
                        "--checkpoint-dir", str(ckpt)], capture_output=True, text=True, env=env, timeout=900)
    return events, r


@needs_deepspeed
@pytest.mark.parametrize("strategy,knobs", [
    ("nvme-opt", OffloadKnobs(optimizer_device="nvme")),
    ("cpu", OffloadKnobs(stage=2, optimizer_device="cpu")),
])
def test_a_real_save_holds_the_predicted_bytes_per_part(tmp_path: Path, strategy: str, knobs: OffloadKnobs) -> None:
    events, r = _save(tmp_path, strategy)
    assert r.returncode == 0, r.stderr[-2000:]
    att = read_events(events)
    assert att is not None
    [call] = att.checkpoints
    predicted = checkpoint_bytes(knobs, TINY, "global_step1")
    measured: dict[str, int] = {}
    for f in call.files:
        size = payload(Path(f.path)) if f.path.endswith(".pt") else f.bytes
        measured[f.part] = measured.get(f.part, 0) + size
    assert measured == {k: v for k, v in {**predicted.per_rank, **predicted.rank0_only}.items()
                        if v or k in (MODEL_STATES, OPTIMIZER_STATES)}
    # each part was timed, in the rank's own process
    assert {i.part for i in call.io} >= {MODEL_STATES, OPTIMIZER_STATES, RECOVERY} | (
        {OFFLOADED} if knobs.nvme_optimizer else set())
    # what the hook saw was written matches the files on disk
    assert call.file_bytes == sum(p.stat().st_size for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    json.dumps(call.to_json())
