"""`iotune lint`: one failing config per rule, ds_nvme_tune's printed block,
clean configs, configs `iotune sweep` emits."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.lint import lint
from iotune.cli import cli
from iotune.model.lint import LintEnv, PathFacts
from iotune.model.sweep import SweepPoint
from iotune.sweep.aio.recommend import ds_fragment
from iotune.sweep.config import aio_block_changes, candidate_config
from iotune.workloads.strategies import STRATEGIES, WorkloadSpec, ds_config

from tests.conftest import needs_deepspeed
from tests.project.test_schemas import conforms, strict_json

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
              params=1_000_000, largest_param_numel=800_000)

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
    (("zero_optimization.stage3_prefetch_bucket_size", 50_000_000), "param-offload-prefetch"),
    (("zero_optimization.offload_optimizer.nvme_path", DELETE), "nvme-path-missing"),
    (("zero_optimization.offload_param.buffer_size", 500_000), "param-buffer-small"),
])
def test_each_rule_fires(change: tuple[str, object], rule: str) -> None:
    env = LintEnv(**{**vars(ENV), "memlock_bytes": None})
    assert rule in rules(with_change(*change), env)


def test_pinned_memory_over_ulimit_and_ram() -> None:
    # issue 14: both swap-buffer sets are counted, at DeepSpeed's 1 KiB alignment:
    # parameters 5 x aligned(1e7) x 2 B (bf16) and optimizer 4 x aligned(1e6 params) x 4 B
    found = {f.rule: f for f in lint(CLEAN, ENV)}
    assert found["pinned-memlock"].message == (
        "swap buffers lock 110.6 MiB per rank (optimizer swap buffers 15.3 MiB (4 x 1,000,192 elements (largest "
        "sub-group, aligned) x 4 B, each in whole pages); parameter swap buffers 95.4 MiB (5 x 10,000,384 elements "
        "(buffer_size, aligned) x 2 B, one allocation)), over ulimit -l (8.0 MiB): mlock fails")
    assert found["pinned-memlock"].severity == "error"
    big = with_change("zero_optimization.offload_param.buffer_size", 2_000_000_000)
    assert "pinned-ram" in rules(big)
    assert "pinned-memlock" not in rules(CLEAN, LintEnv(**{**vars(ENV), "can_lock_unlimited": True}))


@pytest.mark.parametrize("facts,rule", [
    (PathFacts(exists=True, writable=False), "nvme-path-readonly"),
    (PathFacts(exists=True, writable=True, direct_io_problem="the filesystem does not support O_DIRECT"),
     "nvme-path-odirect"),
    (PathFacts(exists=True, writable=True, free_bytes=1_000_000), "nvme-path-small"),
])
def test_nvme_path_rules(facts: PathFacts, rule: str) -> None:
    env = LintEnv(**{**vars(ENV), "memlock_bytes": None, "paths": {"/nvme": facts}})
    assert rule in rules(CLEAN, env)


def test_missing_nvme_path_is_fine() -> None:
    # issue 14: DeepSpeed creates nvme_path itself (os.makedirs(..., exist_ok=True)); the old
    # "nvme-path-absent" error (fix: mkdir -p) was a false alarm
    facts = PathFacts(exists=False, writable=True, free_bytes=10**12, checked="/")
    env = LintEnv(**{**vars(ENV), "memlock_bytes": None, "paths": {"/nvme": facts}})
    assert lint(CLEAN, env) == []


def test_zenflow_rules() -> None:
    zf = ds_config(WorkloadSpec(strategy="zenflow"))
    assert rules(zf) == set()
    zero = zf["zero_optimization"]
    zero["offload_optimizer"]["device"] = "nvme"          # runs, as CPU offload: nvme_path unused
    assert rules(zf) == {"nvme-offload-stage12"}
    del zero["offload_optimizer"]                         # refused at deepspeed.initialize
    assert [(f.rule, f.severity) for f in lint(zf, ENV)] == [("zenflow-device", "error")]


@pytest.mark.parametrize("accelerator,severity", [("cpu", "error"), ("xpu", "error"), ("cuda", "warning"),
                                                  (None, "warning")])
def test_zenflow_at_stage_3_is_an_error_off_cuda_and_unverified_on_it(accelerator: str | None,
                                                                      severity: str) -> None:
    zf = ds_config(WorkloadSpec(strategy="zenflow"))
    zf["zero_optimization"]["stage"] = 3
    for dev in ("cpu", "nvme"):
        zf["zero_optimization"]["offload_optimizer"].update(device=dev, nvme_path="/nvme")
        found = {f.rule: f for f in lint(zf, LintEnv(**{**vars(ENV), "accelerator": accelerator}))}
        assert found["zenflow-stage3"].severity == severity and "zenflow-device" not in found
        assert ("unverified" in found["zenflow-stage3"].message) == (accelerator == "cuda")


def test_ds_nvme_tune_block_is_flagged(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({**CLEAN, "aio": DS_NVME_TUNE_AIO}))
    r = CliRunner().invoke(cli, ["lint", str(cfg), "--json", "--deepspeed", "table", "--accelerator", "cpu"])
    assert r.exit_code == 1
    got = {(f["rule"], f["where"]) for f in json.loads(r.stdout)["findings"]}
    assert {("aio-ignored-key", "aio.num_threads"), ("aio-string-boolean", "aio.single_submit"),
            ("aio-string-boolean", "aio.overlap_events")} <= got


def test_configs_iotune_generates_pass(tmp_path: Path) -> None:
    env = LintEnv(paths={str(tmp_path): GOOD_PATH}, accelerator="cpu")      # iotune runs them on CPU
    for strategy in STRATEGIES:
        spec = WorkloadSpec(strategy=strategy, nvme_path=str(tmp_path),
                            precision="bf16" if strategy == "nvme-all" else "fp32")
        assert lint(ds_config(spec), env) == [], strategy
    point = SweepPoint(block_size=524288, queue_depth=16)
    base = ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path=str(tmp_path)))
    swept = candidate_config(base, aio_block_changes(point.aio()), None)          # what --apply writes
    assert swept["aio"]["queue_depth"] == 16 and lint(swept, env) == []
    fragment = ds_fragment(point, str(tmp_path))                                 # the report's, pasted key by key
    pasted = {"aio": fragment["aio"], **{f"zero_optimization.offload_optimizer.{k}": v
                                         for k, v in fragment["zero_optimization"]["offload_optimizer"].items()}}
    assert lint(candidate_config(base, pasted, None), env) == []


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
    r = CliRunner().invoke(cli, ["lint", str(cfg), "--deepspeed", "table", "--accelerator", "cpu"])
    assert r.exit_code == 0 and r.stdout == f"{cfg}: no problems found\n"


# ---- issue 14: agreement with DeepSpeed 0.19.8 on the patterns seen in public configs ----

FIXTURES = Path(__file__).parents[1] / "data" / "lint"


@dataclass(frozen=True)
class Case:
    accelerator: str          # --accelerator for this fixture
    exit_code: int            # 0: lints clean (warnings allowed); 1: errors
    rule: str | None          # a finding that must be there (an error when exit_code is 1)
    deepspeed: str            # what DeepSpeed's config loading does: accepts | refuses
    reason: str = ""          # DeepSpeed's words that the finding must carry


CASES = {
    # runs in DeepSpeed: no error
    "runs-nvme-infinity-cuda": Case("cuda", 0, "param-offload-prefetch", "accepts"),
    "runs-hf-auto": Case("cpu", 0, "param-offload-prefetch", "accepts"),
    "runs-inference-dtype-elsewhere": Case("cpu", 0, None, "accepts"),
    "runs-cpu-offload-stage2": Case("cpu", 0, None, "accepts"),
    "runs-aio-ignored-default": Case("cpu", 0, "aio-ignored-key", "accepts"),
    "runs-nvme-optimizer-stage1": Case("cpu", 0, "nvme-offload-stage12", "accepts"),
    "runs-quoted-boolean-deprecated": Case("cpu", 0, "ds-deprecated-key", "accepts"),
    # DeepSpeed refuses at startup
    "refuses-typo-zero-key": Case("cuda", 1, "ds-unknown-key", "refuses", "Extra inputs are not permitted"),
    "refuses-param-max-in-nvme": Case("cuda", 1, "ds-unknown-key", "refuses", "Extra inputs are not permitted"),
    "refuses-optimizer-buffer-size": Case("cuda", 1, "ds-unknown-key", "refuses", "Extra inputs are not permitted"),
    "refuses-fractional-prefetch": Case("cuda", 1, "ds-invalid-value", "refuses", "fractional part"),
    "refuses-aio-inside-zero": Case("cuda", 1, "aio-misplaced", "refuses", "Extra inputs are not permitted"),
    "refuses-gds-without-cuda": Case("cpu", 1, "aio-gds-no-cuda", "refuses",
                                     "GDS currently only supported for CUDA accelerator"),
    "refuses-removed-zero-key": Case("cuda", 1, "ds-removed-key", "refuses", "has been removed"),
    "refuses-bad-device-name": Case("cuda", 1, "ds-invalid-value", "refuses", "Input should be 'none', 'cpu' or"),
    "refuses-partial-offload-stage2": Case("cuda", 1, "ds-refused", "refuses",
                                           "Partial offloading only supported for ZeRO Stage 3"),
    "refuses-duplicate-key": Case("cuda", 1, "duplicate-key", "refuses", "Duplicate keys in DeepSpeed config"),
    # DeepSpeed accepts the config but fails when training starts (on the CPU accelerator here)
    # runs on the CPU accelerator, in bf16 partitions when built outside deepspeed.zero.Init (a warning)
    "runs-param-offload-fp32": Case("cpu", 0, "zero3-bf16-partitions", "accepts"),
    "crashes-nvme-without-path": Case("cuda", 1, "nvme-path-missing", "accepts"),
    # ZenFlow: what deepspeed.initialize and the first steps do (test_zenflow_fixtures_run_as_lint_says)
    "runs-zenflow-nvme-stage2": Case("cpu", 0, "nvme-offload-stage12", "accepts"),
    "crashes-zenflow-without-offload": Case("cpu", 1, "zenflow-device", "accepts",
                                            "Zenflow must be used with cpu offload"),
    "crashes-zenflow-stage3": Case("cpu", 1, "zenflow-stage3", "accepts", "Torch not compiled with CUDA enabled"),
}


def test_every_fixture_has_a_case() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(CASES)


def run_lint_cli(path: Path, *args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["lint", str(path), "--json", *args])
    doc = strict_json(r.stdout)
    conforms("lint-1", doc)
    return r.exit_code, doc


@pytest.mark.parametrize("against", ["table", pytest.param("installed", marks=needs_deepspeed)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_verdict(name: str, against: str) -> None:
    case = CASES[name]
    code, doc = run_lint_cli(FIXTURES / f"{name}.json", "--accelerator", case.accelerator, "--deepspeed", against)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert code == case.exit_code, doc["findings"]
    assert (errors != []) == (case.exit_code == 1)
    if case.rule:
        hit = [f for f in doc["findings"] if f["rule"] == case.rule]
        assert hit, doc["findings"]
        if case.exit_code == 1:
            assert any(f["severity"] == "error" and case.reason in f["message"] for f in hit), hit
    assert doc["checked_against"].startswith("DeepSpeed 0.19.8")


def deepspeed_loads(cfg: dict, text: str) -> str | None:
    """What DeepSpeed's own config loading says about `cfg`: None if it
    accepts it, else its error message (models, removed keys, duplicate keys,
    the aio block on this machine's accelerator)."""
    from iotune.analysis.lint.dsimport import deepspeed_quiet, import_deepspeed

    import_deepspeed()
    import hjson
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    try:
        with deepspeed_quiet():
            hjson.loads(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)
            ds_config._reject_removed_config_keys(cfg)
            DeepSpeedZeroConfig(**cfg.get("zero_optimization", {}))
            get_aio_config(cfg)
    except Exception as e:       # noqa: BLE001 - any refusal counts; its message is compared
        return str(e)
    return None


@needs_deepspeed
@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_cross_checked_with_deepspeed(name: str) -> None:
    from iotune.analysis.lint.dsimport import import_deepspeed

    case = CASES[name]
    if name == "refuses-gds-without-cuda" and import_deepspeed().accelerator.get_accelerator().device_name() == "cuda":
        pytest.skip("DeepSpeed runs on CUDA here: the GDS assertion needs another accelerator")
    text = (FIXTURES / f"{name}.json").read_text()
    verdict = deepspeed_loads(json.loads(text), text)
    if case.deepspeed == "accepts":
        assert verdict is None
    else:
        assert verdict is not None and case.reason in verdict


ZENFLOW_RUNS = {"runs-zenflow-nvme-stage2": None,       # None: it trains; else DeepSpeed's words when it stops
                "crashes-zenflow-without-offload": "at deepspeed.initialize: ValueError: Zenflow must be used with "
                                                   "cpu offload",
                "crashes-zenflow-stage3": "at step 1: AssertionError: Torch not compiled with CUDA enabled"}


@needs_deepspeed
@pytest.mark.parametrize("name", sorted(ZENFLOW_RUNS))
def test_zenflow_fixtures_run_as_lint_says(name: str, tmp_path: Path) -> None:
    """Each ZenFlow fixture run for real (deepspeed.initialize and two steps
    of a small MLP on the CPU accelerator): the one lint passes trains, with
    nothing written to nvme_path (stage 2 runs NVMe offload as CPU offload);
    the ones lint calls errors stop where and with the words lint gives."""
    from iotune.analysis.lint.dsimport import import_deepspeed

    if import_deepspeed().accelerator.get_accelerator().device_name() == "cuda":
        pytest.skip("DeepSpeed runs on CUDA here: these runs reproduce the CPU accelerator's behaviour")
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    swap = tmp_path / "swap"
    swap.mkdir()
    if "nvme_path" in cfg["zero_optimization"].get("offload_optimizer", {}):
        cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(swap)
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "data" / "zenflow_job.py"),
                        str(tmp_path / "ds.json"), "2"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    want = ZENFLOW_RUNS[name]
    if want is None:
        assert last == "ZENFLOW_OK 2" and list(swap.iterdir()) == [], last
    else:
        assert last == f"ZENFLOW_FAILED {want}", last
        code, doc = run_lint_cli(FIXTURES / f"{name}.json", "--accelerator", "cpu")
        assert code == 1 and any(want.rsplit(": ", 1)[1] in f["message"] for f in doc["findings"])


@needs_deepspeed
def test_committed_table_is_what_installed_deepspeed_generates() -> None:
    from iotune.analysis.lint.dstable import TABLE_MODULES, committed_table, generate_table

    table = generate_table()
    assert table["deepspeed_version"] in TABLE_MODULES, (
        f"no committed key table for DeepSpeed {table['deepspeed_version']}: run "
        "`python -m iotune.analysis.lint.dstable > iotune/analysis/lint/ds_schema_<version>.py` and list it")
    assert committed_table(table["deepspeed_version"]) == table


ZERO_CASES = [
    {"stage": 3, "stage3_param_persitance_threshold": 10},
    {"stage": 3, "offload_param": {"device": "nvme", "max_in_nvme": 5}},
    {"stage": 3, "stage3_prefetch_bucket_size": 1677722.1},
    {"stage": 3, "stage3_prefetch_bucket_size": 1e8},
    {"stage": 3, "stage3_prefetch_bucket_size": "1e8"},
    {"stage": 3, "stage3_prefetch_bucket_size": " 50000 "},
    {"stage": "3"}, {"stage": 3.0}, {"stage": 4}, {"stage": 1.5}, {"stage": True}, {"stage": None},
    {"offload_param": {"pin_memory": "yes"}}, {"offload_param": {"pin_memory": "maybe"}},
    {"offload_param": {"device": "NVMe"}}, {"offload_param": {"buffer_count": -1}},
    {"offload_param": {"buffer_count": "auto"}}, {"offload_param": "auto"}, {"offload_param": None},
    {"offload_param": {"nvme_path": 5}}, {"offload_optimizer": []}, {"offload_optimizer": {"ratio": "0.5"}},
    {"offload_optimizer": {"ratio": 1.5}}, {"reduce_bucket_size": 0}, {"reduce_bucket_size": [5]},
    {"reduce_bucket_size": "5_000"}, {"overlap_comm": 2}, {"overlap_comm": "on"}, {"overlap_comm": None},
    {"contiguous_gradients": None}, {"sub_group_size": 1e12}, {"sub_group_size": 1e30},
    {"zenflow": {"topk_ratio": 2}}, {"leaf_module": {"bogus": 1}}, {"leaf_module": {"classes": "a"}},
    {"stage3_prefetch_bucket_size": 5, "prefetch_bucket_size": 6}, {"prefetch_bucket_size": 6},
    {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, {"stage": 3, "compute_grad_norm": False},
]


@needs_deepspeed
@pytest.mark.parametrize("zero", ZERO_CASES, ids=[json.dumps(z) for z in ZERO_CASES])
def test_table_refuses_what_deepspeed_refuses(zero: dict) -> None:
    from iotune.analysis.lint.schema import InstalledSchema, table_schema

    cfg = {"zero_optimization": zero}
    installed = {(i.loc, i.kind) for i in InstalledSchema().validate(cfg) if i.kind != "deprecated"}
    table = {(i.loc, i.kind) for i in table_schema().validate(cfg) if i.kind != "deprecated"}
    assert table == installed


def test_json_error_document_for_unreadable_and_invalid_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3,}}')
    listy = tmp_path / "list.json"
    listy.write_text("[1, 2]")
    for path, kind in ((tmp_path / "missing.json", "unreadable"), (bad, "invalid-json"), (listy, "not-an-object")):
        r = CliRunner().invoke(cli, ["lint", str(path), "--json"])
        assert r.exit_code == 2
        doc = json.loads(r.stdout)
        conforms("lint-1", doc, optional=set())
        assert doc["config"] == str(path) and doc["findings"] == [] and doc["error"]["kind"] == kind
        assert r.stderr == f"Error: {doc['error']['message']}\n"
    good = tmp_path / "good.json"
    good.write_text("{}")
    r = CliRunner().invoke(cli, ["lint", str(good), "--json", "--model", "huge"])
    conforms("lint-1", json.loads(r.stdout), optional=set())
    assert r.exit_code == 2 and json.loads(r.stdout)["error"] == {
        "kind": "bad-input", "message": "unknown --model 'huge': choose one of tiny, small, medium, wide, 1b, 3b, 8b, 16b",
        "exit_code": 2}


def test_json_error_document_without_json_flag_keeps_stdout_empty(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["lint", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and r.stdout == ""


@needs_deepspeed
def test_deepspeed_logs_stay_off_stdout(tmp_path: Path) -> None:
    """In a fresh process DeepSpeed's import logs ("Setting accelerator to CPU")
    and its deprecation warnings would land on stdout; --json must stay parseable."""
    import os
    import subprocess
    import sys

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 2, "cpu_offload": True}}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-m", "iotune", "lint", str(cfg), "--json", "--deepspeed", "installed"],
                         capture_output=True, text=True, env=env, timeout=300)
    doc = json.loads(out.stdout)
    assert out.returncode == 0
    assert [f["rule"] for f in doc["findings"]] == ["ds-deprecated-key"]


def env_for(accelerator: str | None, **kw: object) -> LintEnv:
    return LintEnv(**{**vars(ENV), "memlock_bytes": None, "accelerator": accelerator, **kw})


def severity_of(cfg: dict, rule: str, env: LintEnv) -> str | None:
    found = [f.severity for f in lint(cfg, env) if f.rule == rule]
    return found[0] if found else None


@pytest.mark.parametrize("accelerator,severity", [("cpu", "error"), ("cuda", "warning"), (None, "warning")])
def test_prefetch_rule_is_an_error_only_on_cpu(accelerator: str | None, severity: str) -> None:
    cfg = with_change("zero_optimization.stage3_prefetch_bucket_size", DELETE)      # DeepSpeed's default 5e7
    assert severity_of(cfg, "param-offload-prefetch", env_for(accelerator)) == severity


def test_auto_values_make_warnings_that_say_what_they_assume() -> None:
    cfg = with_change("zero_optimization.stage3_prefetch_bucket_size", "auto")
    cfg["bf16"] = {"enabled": "auto"}
    found = {f.rule: f for f in lint(cfg, env_for("cpu"))}
    assert found["param-offload-prefetch"].severity == "warning"
    assert "assumed non-zero" in found["param-offload-prefetch"].message
    assert "zero3-bf16-partitions" not in found            # the dtype is Hugging Face's to decide


@pytest.mark.parametrize("precision,severity", [
    ({"fp16": {"enabled": False}}, "warning"),       # known fp32 on the CPU accelerator: runs, maybe in bf16
    ({"fp16": {"enabled": "auto"}}, None),           # Hugging Face decides
    ({}, None),                                      # no block: the loading program sets the dtype
    ({"fp16": {"enabled": True}}, None),
])
def test_fp32_on_the_cpu_accelerator_is_said_to_run_in_bf16_partitions(precision: dict, severity: str | None) -> None:
    """Reproduced with DeepSpeed 0.19.8 here: parameter offload to NVMe in
    fp32 runs (the built-in model under deepspeed.zero.Init swaps
    float32params; tests/data/gpt_job.py, built outside it, bfloat16params)."""
    cfg = with_change("bf16", DELETE)
    cfg.update(precision)
    assert severity_of(cfg, "zero3-bf16-partitions", env_for("cpu")) == severity
    assert severity_of(cfg, "zero3-bf16-partitions", env_for("cuda")) is None


def test_pinned_bytes_by_dtype_whatever_pin_memory_says() -> None:
    from iotune.analysis.lint import pinned_bytes

    cfg = {"fp16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_param": {
        "device": "nvme", "nvme_path": "/nvme", "pin_memory": False, "buffer_count": 4, "buffer_size": 1 << 20}}}
    assert pinned_bytes(cfg) == 4 * (1 << 20) * 2                          # fp16: 2 B, locked anyway (one allocation)
    cfg["fp16"] = {"enabled": False}
    assert pinned_bytes(cfg) == 4 * (1 << 20) * 4                          # fp32
    assert pinned_bytes({**cfg, "aio": {"use_gds": True}}) == 0            # GDS: buffers on the GPU
    opt = {"zero_optimization": {"stage": 3, "sub_group_size": 1e12,
                                 "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    page = 4096                         # each optimizer buffer is its own allocation, locked in whole pages
    assert pinned_bytes(opt, LintEnv(params=8_000_000, gpus=2)) == 4 * -(-4_000_000 * 4 // page) * page  # 4 buffers
    opt["zero_optimization"]["sub_group_size"] = 1_000_000
    assert pinned_bytes(opt, LintEnv(params=8_000_000, gpus=2)) == 4 * -(-1_000_192 * 4 // page) * page  # aligned
    opt["zero_optimization"]["stage"] = 2
    assert pinned_bytes(opt, LintEnv(params=8_000_000)) == 0                # stage 2: CPU offload, no swapper


@pytest.mark.parametrize("value,lost", [(1, False), (4, True)])
def test_an_ignored_aio_key_is_a_warning_that_says_whether_the_value_is_lost(value: int, lost: bool) -> None:
    """DeepSpeed runs configs with thread_count (its own examples do): a warning, never an error."""
    found = [f for f in lint(with_change("aio.num_threads", value), env_for("cpu")) if f.rule == "aio-ignored-key"]
    assert [f.severity for f in found] == ["warning"]
    assert ("the setting you meant is not applied" in found[0].message) == lost


@pytest.mark.parametrize("dev,ratio,rules", [("nvme", 0.5, {"partial-offload-nvme"}), ("nvme", 1.0, set()),
                                             ("cpu", 0.5, set()), ("nvme", "auto", set())])
def test_partial_offload_to_nvme_is_an_error(dev: str, ratio: object, rules: set[str]) -> None:
    cfg = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": dev, "nvme_path": "/nvme",
                                                                    "ratio": ratio}}}
    found = {f.rule for f in lint(cfg, env_for("cuda")) if f.severity == "error"}
    assert found & {"partial-offload-nvme"} == rules


def test_nvme_optimizer_offload_at_stage_1_or_2() -> None:
    cfg = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    assert severity_of(cfg, "nvme-offload-stage12", LintEnv()) == "warning"
    small = LintEnv(params=8_000_000_000, ram_bytes=32 << 30)                # 96 GB of optimizer state in RAM
    assert severity_of(cfg, "nvme-offload-stage12", small) == "error"


def test_use_gds_string_false_is_true_for_deepspeed() -> None:
    cfg = with_change("aio.use_gds", "false")
    found = [f for f in lint(cfg, env_for("cpu")) if f.rule == "aio-gds-no-cuda"]
    assert found and found[0].severity == "error" and found[0].fix == "write false without quotes"


def test_nvme_path_under_unmounted_mount_point_is_never_fixed_with_mkdir(tmp_path: Path) -> None:
    from iotune.doctor.facts import path_facts

    mnt = tmp_path / "nvme0"
    mnt.mkdir()
    facts = path_facts(str(mnt / "ds" / "swap"), fstab={str(mnt): "/dev/nvme0n1p1", "/": "/dev/vda"},
                       mounted={"/"})
    assert facts.unmounted_mount_point == str(mnt) and facts.fstab_source == "/dev/nvme0n1p1"
    cfg = with_change("zero_optimization.offload_param.nvme_path", str(mnt / "ds" / "swap"))
    env = LintEnv(paths={str(mnt / "ds" / "swap"): facts})
    found = [f for f in lint(cfg, env) if f.rule == "nvme-path-unmounted"]
    assert found and found[0].severity == "error"
    assert found[0].fix == f"mount the drive first: mount {mnt} (do not mkdir the path)"
    assert all("mkdir -p" not in f.fix for f in lint(cfg, env))
    mounted = path_facts(str(mnt / "ds"), fstab={str(mnt): "/dev/nvme0n1p1"}, mounted={"/", str(mnt)})
    assert mounted.unmounted_mount_point is None and mounted.checked == str(mnt)


def test_nvme_path_checked_at_its_nearest_existing_ancestor(tmp_path: Path) -> None:
    from iotune.doctor.facts import path_facts

    facts = path_facts(str(tmp_path / "not" / "yet"), fstab={}, mounted=set())
    assert (facts.exists, facts.checked, facts.writable, facts.direct_io_problem) == \
        (False, str(tmp_path), True, None)
    assert facts.free_bytes and facts.free_bytes > 0
    (tmp_path / "file").write_text("x")
    blocked = path_facts(str(tmp_path / "file" / "swap"), fstab={}, mounted=set())
    assert blocked.not_a_directory and blocked.checked == str(tmp_path / "file")
    cfg = with_change("zero_optimization.offload_param.nvme_path", str(tmp_path / "not" / "yet"))
    cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(tmp_path / "not" / "yet")
    assert lint(cfg, LintEnv(paths={str(tmp_path / "not" / "yet"): facts})) == []
    wrong = LintEnv(paths={str(tmp_path / "not" / "yet"): facts}, expected_device="/dev/nvme9n1")
    if facts.device:
        assert [f.rule for f in lint(cfg, wrong)] == ["nvme-path-wrong-device"]


def test_nvme_path_capacity_counts_what_the_plan_puts_there() -> None:
    facts = PathFacts(exists=True, writable=True, free_bytes=13_000_000, checked="/nvme")
    env = LintEnv(paths={"/nvme": facts}, params=1_000_000)  # 12 B optimizer + 4 B gradient files + 2 B bf16 = 18 MB
    found = [f for f in lint(CLEAN, env) if f.rule == "nvme-path-small"]
    assert found and "need 17.2 MiB (18 B per parameter)" in found[0].message


def test_typo_fix_names_the_nearest_valid_key() -> None:
    cfg = with_change("zero_optimization.stage3_max_live_paramters", 1e9)
    found = [f for f in lint(cfg, env_for("cpu")) if f.rule == "ds-unknown-key"]
    assert found[0].fix == ("did you mean stage3_max_live_parameters? rename stage3_max_live_paramters to "
                            "stage3_max_live_parameters")
    moved = with_change("zero_optimization.offload_optimizer.sub_group_size", 1e9)
    found = [f for f in lint(moved, env_for("cpu")) if f.rule == "ds-unknown-key"]
    assert found[0].fix == "sub_group_size belongs in zero_optimization: move it there"


def test_lint_report_round_trips_through_json() -> None:
    from iotune.model.lint import LintFailure
    from iotune.model.reports import LintReport

    report = LintReport("ds.json", tuple(lint(with_change("aio.num_threads", 4), ENV)), None,
                        "DeepSpeed 0.19.8 key table", "cpu (given)")
    assert LintReport.from_json(report.to_json()) == report
    failed = LintReport("x.json", (), LintFailure("invalid-json", "x.json is not valid JSON", 2))
    assert LintReport.from_json(json.loads(json.dumps(failed.to_json()))) == failed
    assert LintReport.from_json({"config": "old.json", "findings": []}) == LintReport("old.json", ())


def test_without_deepspeed_the_table_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed", None)          # `import deepspeed` raises ImportError
    code, doc = run_lint_cli(FIXTURES / "refuses-typo-zero-key.json", "--accelerator", "cpu")
    assert code == 1
    assert doc["checked_against"] == "DeepSpeed 0.19.8 key table (DeepSpeed not installed)"
    assert [f["rule"] for f in doc["findings"]] == ["ds-unknown-key"]
    r = CliRunner().invoke(cli, ["lint", str(FIXTURES / "refuses-typo-zero-key.json"), "--json",
                                 "--deepspeed", "installed", "--accelerator", "cpu"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["kind"] == "no-deepspeed"


def test_accelerator_detection_follows_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """DS_ACCELERATOR decides; without it and without torch, nothing is assumed."""
    from iotune.doctor import facts
    from iotune.doctor.facts import detect_accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "xpu")
    assert detect_accelerator() == ("xpu", "DS_ACCELERATOR")
    monkeypatch.delenv("DS_ACCELERATOR")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(facts.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    assert detect_accelerator() == (None, "torch is not installed here")


@needs_deepspeed
def test_accelerator_detection_follows_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from iotune.doctor.facts import detect_accelerator

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    want = "cuda" if torch.cuda.device_count() > 0 and torch.cuda.is_available() else "cpu"
    assert detect_accelerator()[0] == want


def test_empty_unmounted_directory_under_mnt_is_a_warning(tmp_path: Path) -> None:
    from iotune.doctor.facts import looks_unmounted

    (tmp_path / "nvme0").mkdir()
    assert looks_unmounted(str(tmp_path / "nvme0"), set(), (str(tmp_path),)) == str(tmp_path / "nvme0")
    assert looks_unmounted(str(tmp_path / "nvme0"), {str(tmp_path / "nvme0")}, (str(tmp_path),)) is None
    (tmp_path / "nvme0" / "data").write_text("x")
    assert looks_unmounted(str(tmp_path / "nvme0"), set(), (str(tmp_path),)) is None
    facts = PathFacts(exists=False, writable=True, free_bytes=10**12, checked="/mnt/nvme0",
                      looks_unmounted="/mnt/nvme0")
    found = [f for f in lint(CLEAN, LintEnv(paths={"/nvme": facts})) if f.rule == "nvme-path-maybe-unmounted"]
    assert found and found[0].severity == "warning" and "mkdir" in found[0].fix and "do not" in found[0].fix


def test_parameter_swap_out_buffer_when_parameters_exceed_max_in_cpu() -> None:
    from iotune.analysis.lint import locked_buffers

    cfg = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "sub_group_size": 102_400_000,
                                                           "offload_param": {"device": "nvme", "nvme_path": "/nvme",
                                                                             "max_in_cpu": 1_000_000_000}}}
    assert [b.label for b in locked_buffers(cfg, LintEnv(params=900_000_000))] == ["parameter swap buffers"]
    big = {b.label: b for b in locked_buffers(cfg, LintEnv(params=3_000_000_000))}
    assert big["parameter swap-out buffer"].nbytes == 102_400_000 * 2          # one sub-group (a multiple of 512), 2 B


@pytest.mark.parametrize("path,rules", [("none", {"nvme-path-relative"}), ("swap/dir", {"nvme-path-relative"}),
                                        ("/nvme", set())])
def test_a_relative_nvme_path_is_a_warning(path: str, rules: set[str]) -> None:
    cfg = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": path}}}
    found = {(f.rule, f.severity) for f in lint(cfg, env_for("cuda")) if f.rule == "nvme-path-relative"}
    assert found == {(r, "warning") for r in rules}
