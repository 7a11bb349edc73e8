"""`iotune lint`: one failing config per rule, ds_nvme_tune's printed block,
clean configs, configs `iotune sweep` emits."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.lint import lint
from iotune.cli import cli
from iotune.model.lint import LintEnv, PathFacts
from iotune.model.sweep import SweepPoint
from iotune.sweep.recommend import ds_fragment, merge
from iotune.workloads.strategies import STRATEGIES, WorkloadSpec, ds_config

GOOD_PATH = PathFacts(exists=True, writable=True, direct_io_problem=None, free_bytes=10**12)
CLEAN = {
    "train_micro_batch_size_per_gpu": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3, "stage3_prefetch_bucket_size": 0,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": True},
        "offload_param": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": True, "buffer_count": 5,
                          "buffer_size": 10_000_000},
    },
    "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
            "overlap_events": True, "use_gds": False},
}
ENV = LintEnv(ram_bytes=24 << 30, memlock_bytes=8 << 20, can_lock_unlimited=False, paths={"/nvme": GOOD_PATH},
              params=1_000_000, largest_param_numel=5_000_000)

# ds_nvme_tune's printed block (DeepSpeed 0.19.8): num_threads is ignored, booleans are strings
DS_NVME_TUNE_AIO = {"block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 1,
                    "single_submit": "false", "overlap_events": "true", "num_threads": 1}


def with_change(path: str, value: object) -> dict:
    cfg = copy.deepcopy(CLEAN)
    *parents, last = path.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return cfg


DELETE = object()


def rules(cfg: dict, env: LintEnv = ENV) -> set[str]:
    return {f.rule for f in lint(cfg, env)}


def test_clean_config_passes() -> None:
    env = LintEnv(**{**vars(ENV), "memlock_bytes": None})
    assert lint(CLEAN, env) == []


@pytest.mark.parametrize("change,rule", [
    (("aio.num_threads", 4), "aio-ignored-key"),
    (("aio.thread_count", 4), "aio-ignored-key"),
    (("aio.single_submit", "false"), "aio-string-boolean"),
    (("aio.queue_dept", 8), "aio-unknown-key"),
    (("aio.queue_depth", 0), "aio-bad-number"),
    (("zero_optimization.aio", {"block_size": 1048576}), "aio-misplaced"),
    (("zero_optimization.offload_optimizer.pin_memory", "true"), "string-boolean"),
    (("bf16", DELETE), "param-offload-fp32"),
    (("zero_optimization.stage3_prefetch_bucket_size", 50_000_000), "param-offload-prefetch"),
    (("zero_optimization.offload_optimizer.nvme_path", DELETE), "nvme-path-missing"),
    (("zero_optimization.offload_param.buffer_size", 1_000_000), "param-buffer-small"),
])
def test_each_rule_fires(change: tuple[str, object], rule: str) -> None:
    env = LintEnv(**{**vars(ENV), "memlock_bytes": None})
    assert rule in rules(with_change(*change), env)


def test_pinned_memory_over_ulimit_and_ram() -> None:
    found = {f.rule: f for f in lint(CLEAN, ENV)}        # 5 x 1e7 x 2 B = 100 MB pinned > 8 MiB memlock
    assert found["pinned-memlock"].message.startswith("parameter swap buffers pin 0.09 GiB, over ulimit -l")
    big = with_change("zero_optimization.offload_param.buffer_size", 2_000_000_000)
    assert "pinned-ram" in rules(big)
    assert "pinned-memlock" not in rules(CLEAN, LintEnv(**{**vars(ENV), "can_lock_unlimited": True}))


@pytest.mark.parametrize("facts,rule", [
    (PathFacts(exists=False), "nvme-path-absent"),
    (PathFacts(exists=True, writable=False), "nvme-path-readonly"),
    (PathFacts(exists=True, writable=True, direct_io_problem="the filesystem does not support O_DIRECT"),
     "nvme-path-odirect"),
    (PathFacts(exists=True, writable=True, free_bytes=1_000_000), "nvme-path-small"),
])
def test_nvme_path_rules(facts: PathFacts, rule: str) -> None:
    env = LintEnv(**{**vars(ENV), "memlock_bytes": None, "paths": {"/nvme": facts}})
    assert rule in rules(CLEAN, env)


def test_zenflow_rules() -> None:
    zf = ds_config(WorkloadSpec(strategy="zenflow"))
    assert rules(zf) == set()
    zf["zero_optimization"]["offload_optimizer"]["device"] = "nvme"
    zf["zero_optimization"]["stage"] = 3
    assert {"zenflow-device", "zenflow-stage3"} <= rules(zf)


def test_ds_nvme_tune_block_is_flagged(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({**CLEAN, "aio": DS_NVME_TUNE_AIO}))
    r = CliRunner().invoke(cli, ["lint", str(cfg), "--json"])
    assert r.exit_code == 1
    got = {(f["rule"], f["where"]) for f in json.loads(r.stdout)["findings"]}
    assert {("aio-ignored-key", "aio.num_threads"), ("aio-string-boolean", "aio.single_submit"),
            ("aio-string-boolean", "aio.overlap_events")} <= got


def test_configs_iotune_generates_pass(tmp_path: Path) -> None:
    env = LintEnv(paths={str(tmp_path): GOOD_PATH})
    for strategy in STRATEGIES:
        spec = WorkloadSpec(strategy=strategy, nvme_path=str(tmp_path),
                            precision="bf16" if strategy == "nvme-all" else "fp32")
        assert lint(ds_config(spec), env) == [], strategy
    swept = merge(ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path=str(tmp_path))),
                  ds_fragment(SweepPoint(block_size=524288, queue_depth=16), str(tmp_path)))
    assert lint(swept, env) == []


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text('{\n  "aio": {"block_size": 1048576,}\n}')
    r = CliRunner().invoke(cli, ["lint", str(cfg)])
    assert r.exit_code == 2
    assert r.stderr == (f"Error: {cfg} is not valid JSON (line 2, column 33): "
                        f"Expecting property name enclosed in double quotes\n")


def test_clean_file_exit_zero(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(ds_config(WorkloadSpec(strategy="cpu"))))
    r = CliRunner().invoke(cli, ["lint", str(cfg)])
    assert r.exit_code == 0 and r.stdout == f"{cfg}: no problems found\n"
