"""The checkpoint rules of `iotune lint` and `iotune doctor`, each fired on its
config, and each failure reproduced by DeepSpeed 0.19.8 itself: its own
config reader, its own fast writer's buffer, or a real run that fails (or,
worse, succeeds wrongly) the way the rule says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.analysis.lint import lint
from iotune.cli import cli
from iotune.doctor.checkpoint import checkpoint_checks
from iotune.model.lint import LintEnv, PathFacts

from tests.conftest import needs_deepspeed


def nvme(swap: str = "/nvme/swap", **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": swap}}}
    cfg.update(extra)
    return cfg


def rules(cfg: dict[str, Any], env: LintEnv = LintEnv()) -> dict[str, str]:
    return {f.rule: f.severity for f in lint(cfg, env) if f.rule.startswith("checkpoint")}


def test_each_rule_fires_on_its_config_and_only_there() -> None:
    assert rules(nvme()) == {}                                    # a job that says nothing about checkpoints
    plain = rules(nvme(checkpoint={"tag_validation": "Warn"}))
    assert plain == {"checkpoint-nvme-world-size": "warning", "checkpoint-nvme-optimizer-restart": "warning"}
    typo = lint(nvme(checkpoint={"writer": {"type": "python", "io_bufer_size": 1 << 20}, "save_dir": "/x"}), LintEnv())
    where = {f.where for f in typo if f.rule == "checkpoint-unknown-key"}
    assert where == {"checkpoint.writer.io_bufer_size", "checkpoint.save_dir"}
    assert rules(nvme(checkpoint={"writer": {"type": "nvme"}}))["checkpoint-writer-type"] == "error"
    assert rules(nvme(checkpoint={"writer": {"type": "mock"}}))["checkpoint-mock-writer"] == "error"
    fast = {"checkpoint": {"writer": {}}}
    assert rules(nvme(**fast), LintEnv(accelerator="cpu"))["checkpoint-fast-writer-cpu"] == "error"
    assert "checkpoint-fast-writer-cpu" not in rules(nvme(**fast), LintEnv(accelerator="cuda"))
    assert rules(nvme(**fast))["checkpoint-writer-launcher"] == "warning"
    odd = {"checkpoint": {"writer": {"type": "fast", "io_buffer_size": 1_000_000}}}
    assert rules(nvme(**odd))["checkpoint-io-buffer"] == "error"
    single = {"checkpoint": {"writer": {"type": "fast", "io_buffer_size": 999_936, "io_buffer_double": False}}}
    assert "checkpoint-io-buffer" not in rules(nvme(**single))                    # 1953 x 512 B
    assert "checkpoint-io-buffer" in rules(nvme(aio={"intra_op_parallelism": 2}, **single))
    local = rules(nvme(checkpoint={"use_node_local_storage": True}))
    assert local["checkpoint-7549"] == "warning"


def test_a_checkpoint_directory_in_the_swap_tree_and_one_that_does_not_fit() -> None:
    inside = lint(nvme("/nvme/swap"), LintEnv(checkpoint_dir="/nvme/swap/zero_stage_3/optimizer/rank0/ckpt"))
    [f] = [f for f in inside if f.rule == "checkpoint-dir-in-swap"]
    assert f.severity == "error" and "copytree recurses" in f.message
    beside = lint(nvme("/nvme/swap"), LintEnv(checkpoint_dir="/nvme/swap/ckpts"))
    assert [f.severity for f in beside if f.rule == "checkpoint-dir-in-swap"] == ["warning"]
    same_fs = PathFacts(exists=True, writable=True, free_bytes=10**12, checked="/nvme", fs_dev=7)
    env = LintEnv(params=14_000_000_000, checkpoint_dir="/nvme/ckpt", checkpoint_keep=3,
                  checkpoint_facts=same_fs, paths={"/nvme/swap": same_fs})
    # 3 x 168 GB of checkpoints + 224 GB of swap files = 728 GB of 1 TB free: fits
    assert "checkpoint-space" not in rules(nvme("/nvme/swap"), env)


def test_keep_against_the_free_space_names_the_numbers() -> None:
    facts = PathFacts(exists=True, writable=True, free_bytes=10**12, checked="/nvme", fs_dev=7)
    env = LintEnv(params=14_000_000_000, checkpoint_dir="/nvme/ckpt", checkpoint_keep=5, checkpoint_facts=facts,
                  paths={"/nvme/swap": facts})
    [space] = [f for f in lint(nvme("/nvme/swap"), env) if f.rule == "checkpoint-space"]
    assert space.message == ("/nvme/ckpt has 1.00 TB free; 5 checkpoint(s) of 168.00 GB + 224.00 GB of swap files in "
                             "/nvme/swap on the same filesystem need 1.06 TB")
    other_fs = PathFacts(exists=True, writable=True, free_bytes=10**12, checked="/data", fs_dev=8)
    assert not [f for f in lint(nvme("/nvme/swap"), LintEnv(**{**vars(env), "checkpoint_facts": other_fs}))
                if f.rule == "checkpoint-space"]


def test_doctor_names_earlier_tags_a_new_save_cannot_overwrite(tmp_path: Path) -> None:
    (tmp_path / "global_step100" / "offloaded_tensors" / "rank00").mkdir(parents=True)
    (tmp_path / "global_step200").mkdir()
    checks = {c.name: c for c in checkpoint_checks(nvme(), LintEnv(checkpoint_dir=str(tmp_path)))}
    left = checks[f"earlier checkpoints in {tmp_path}"]
    assert left.status == "warn" and "1 tag(s)" in left.detail and "global_step100" in left.detail
    assert "#7549" in left.detail


def test_lint_cli_takes_the_checkpoint_directory(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(nvme(str(tmp_path / "swap"))))
    r = CliRunner().invoke(cli, ["lint", str(cfg), "--checkpoint-dir", str(tmp_path / "swap" / "zero_stage_3" / "c"),
                                 "--deepspeed", "table", "--accelerator", "cpu", "--json"])
    assert r.exit_code == 1
    assert "checkpoint-dir-in-swap" in {f["rule"] for f in json.loads(r.stdout)["findings"]}
    r = CliRunner().invoke(cli, ["lint", str(cfg), "--keep", "3", "--deepspeed", "table", "--accelerator", "cpu"])
    assert r.exit_code == 2 and "--keep goes with --checkpoint-dir DIR" in r.output


# -- DeepSpeed's own reader and buffer --------------------------------------------

@needs_deepspeed
def test_deepspeed_ignores_unknown_writer_keys_and_asserts_on_a_bad_type() -> None:
    from deepspeed.runtime.model_checkpointing.config import get_checkpoint_config

    read = get_checkpoint_config({"checkpoint": {"writer": {"type": "fast", "io_bufer_size": 1 << 20},
                                                 "save_dir": "/x"}})
    assert read["writer"]["io_buffer_size"] == 64 << 20 and "save_dir" not in read    # the typo's value is lost
    with pytest.raises(AssertionError, match="invalid value NVME for type"):
        get_checkpoint_config({"checkpoint": {"writer": {"type": "nvme"}}})


@needs_deepspeed
def test_the_fast_writers_double_buffer_asserts_on_an_odd_size() -> None:
    import torch
    from deepspeed.io.double_io_buffer import Double_IO_Buffer
    from deepspeed.ops.op_builder import AsyncIOBuilder

    handle = AsyncIOBuilder().load().aio_handle(1 << 20, 8, False, True, 1)
    assert handle.get_alignment() == 512
    Double_IO_Buffer(torch.empty(1 << 20, dtype=torch.uint8), handle)
    with pytest.raises(AssertionError):
        Double_IO_Buffer(torch.empty(1_000_000, dtype=torch.uint8), handle)


# -- real runs ----------------------------------------------------------------------

SCRIPT = """
import json, sys, torch, deepspeed
cfg, action, where = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
loss = engine(torch.randn(4, 512)).float().pow(2).mean()
engine.backward(loss)
engine.step()
engine.save_checkpoint(where, tag="t")
print("SAVED", flush=True)
if action == "twice":
    engine.save_checkpoint(where, tag="t")
"""


def run_script(tmp_path: Path, cfg: dict[str, Any], action: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29000 + os.getpid() % 3000), "CROSS_RANK": "0", "CROSS_SIZE": "1"}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT, json.dumps(cfg), action,
                           str(tmp_path / "ckpt")], capture_output=True, text=True, env={**base, **(env or {})},
                          timeout=600)


def swap_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    (tmp_path / "swap").mkdir(exist_ok=True)
    return nvme(str(tmp_path / "swap"), **extra)


@needs_deepspeed
def test_saving_a_tag_again_fails_with_file_exists_7549(tmp_path: Path) -> None:
    r = run_script(tmp_path, swap_config(tmp_path), "twice")
    assert "SAVED" in r.stdout and r.returncode != 0
    assert "FileExistsError" in r.stderr and "offloaded_tensors/rank00" in r.stderr


@needs_deepspeed
def test_a_writer_block_without_the_launchers_variables_fails_at_start_up(tmp_path: Path) -> None:
    cfg = swap_config(tmp_path, checkpoint={"writer": {"type": "python"}})
    env = {k: v for k, v in os.environ.items() if k not in ("CROSS_RANK", "CROSS_SIZE")}
    base = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29100 + os.getpid() % 3000)}
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT, json.dumps(cfg), "once",
                        str(tmp_path / "ckpt")], capture_output=True, text=True, env={**env, **base}, timeout=600)
    assert r.returncode != 0 and "KeyError: 'CROSS_SIZE'" in r.stderr and "SAVED" not in r.stdout
    assert run_script(tmp_path, cfg, "once").returncode == 0                      # with them, it saves


@needs_deepspeed
def test_the_fast_writer_fails_at_start_up_on_the_cpu_accelerator(tmp_path: Path) -> None:
    r = run_script(tmp_path, swap_config(tmp_path, checkpoint={"writer": {"type": "fast"}}), "once")
    assert r.returncode != 0 and "SAVED" not in r.stdout
    assert "Cannot access accelerator device when none is available" in r.stderr


@needs_deepspeed
def test_the_mock_writer_leaves_empty_files(tmp_path: Path) -> None:
    r = run_script(tmp_path, swap_config(tmp_path, checkpoint={"writer": {"type": "mock"}}), "once")
    assert r.returncode == 0, r.stderr[-2000:]
    states = sorted((tmp_path / "ckpt" / "t").glob("*.pt"))
    assert len(states) == 2 and all(p.stat().st_size == 0 for p in states)


@needs_deepspeed
def test_a_checkpoint_inside_the_swap_tree_copies_itself_until_the_path_is_too_long(tmp_path: Path) -> None:
    swap = tmp_path / "swap"
    swap.mkdir()
    inside = swap / "zero_stage_3" / "optimizer" / "rank0" / "ckpt"
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
                        "--size", "tiny", "--nvme-path", str(swap), "--steps", "1", "--checkpoint-dir", str(inside)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and "shutil.Error" in r.stderr
    level = Path("global_step1", "offloaded_tensors", "rank00", "ckpt")
    assert (inside / level / level / level).is_dir(), "the copy did not recurse"
    shutil.rmtree(swap)                  # gigabytes of copies of copies
    [f] = [f for f in lint(nvme(str(swap)), LintEnv(checkpoint_dir=str(inside))) if f.rule == "checkpoint-dir-in-swap"]
    assert f.severity == "error"


@needs_deepspeed
def test_nvme_state_saved_at_two_ranks_loads_wrongly_at_one_without_an_error(tmp_path: Path) -> None:
    """Rule checkpoint-nvme-world-size: two ranks (the deepspeed launcher, CPU
    ranks) save after step 2; one rank loads it, with no error, and its next
    loss is not the uninterrupted run's."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    assert launcher is not None
    swap, ckpt = tmp_path / "swap", tmp_path / "ckpt"
    swap.mkdir()
    train = Path(__file__).resolve().parents[2] / "iotune" / "workloads" / "train.py"
    common = ["--strategy", "nvme-opt", "--size", "tiny", "--nvme-path", str(swap), "--checkpoint-dir", str(ckpt)]
    port = str(29300 + os.getpid() % 2000)
    two = subprocess.run([launcher, "--num_gpus", "2", "--master_port", port, str(train), *common, "--steps", "3",
                          "--save-at", "2"], capture_output=True, text=True, timeout=1200)
    assert two.returncode == 0, two.stderr[-2000:]
    assert sorted(p.name for p in (ckpt / "global_step2" / "offloaded_tensors").iterdir()) == ["rank00", "rank01"]
    expected = [json.loads(line.split(" ", 1)[1])["loss"] for line in two.stdout.splitlines()
                if line.startswith("IOTUNE_STEP") and '"step": 3' in line][0]
    shutil.rmtree(swap)
    swap.mkdir()
    one = subprocess.run([sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", *common, "--steps", "3",
                          "--load-checkpoint", str(ckpt)], capture_output=True, text=True, timeout=900)
    assert one.returncode == 0, one.stderr[-2000:]                                  # no error at all
    [step3] = [json.loads(line.split(" ", 1)[1]) for line in one.stdout.splitlines() if line.startswith("IOTUNE_STEP")]
    assert step3["step"] == 3 and abs(step3["loss"] - expected) > 0.1 * expected, (step3["loss"], expected)
