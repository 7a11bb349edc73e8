"""`plan` and `doctor --ds-config` hand the host-memory model the same
inputs (iotune.cli.host_inputs): for the same config and --accelerator they
give the same peak, and both say which accelerator they model and why. The
process baseline (a DeepSpeed child, iotune.workloads.baseline) and the
async_io probe are stubbed: DeepSpeed's cpu accelerator holding 1 GiB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli, host_inputs
from iotune.doctor import jobfacts
from iotune.doctor.job import DOCTOR_STATUS
from iotune.model.host_memory import host_fit
from iotune.workloads.strategies import WorkloadSpec, ds_config

GiB = 1 << 30
BASELINE = 1 * GiB


@pytest.fixture
def here_cpu(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """This machine's DeepSpeed runs on cpu, a process with it holding 1 GiB;
    the list counts the measurements asked for."""
    calls: list[int] = []

    def measured() -> tuple[str, int]:
        calls.append(1)
        return "cpu", BASELINE

    monkeypatch.setattr(host_inputs, "machine_baseline", measured)
    monkeypatch.setattr(jobfacts, "probe_async_io", lambda timeout_s, env=None: jobfacts.AioProbe(True, True))
    return calls


def defaults_1b(tmp_path: Path, **aio: Any) -> Path:
    """The built-in workload's 1b config (bf16, micro-batch 1) with DeepSpeed's own offload defaults
    (sub_group_size 1e9, 4 optimizer swap buffers): the config docs/guide/seed-scale.md starts from."""
    cfg = ds_config(WorkloadSpec(strategy="nvme-opt", size="1b", nvme_path=str(tmp_path / "swap"), precision="bf16",
                                 micro_batch=1, seq_len=128))
    for key in ("buffer_count", "pin_memory"):
        cfg["zero_optimization"]["offload_optimizer"].pop(key)
    cfg["aio"].update(aio)
    path = tmp_path / "ds_defaults.json"
    path.write_text(json.dumps(cfg))
    return path


def plan_json(cfg: Path, *args: str) -> dict[str, Any]:
    r = CliRunner().invoke(cli, ["plan", "--model", "1b", "--ds-config", str(cfg), *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def doctor_json(cfg: Path, *args: str) -> dict[str, dict[str, Any]]:
    r = CliRunner().invoke(cli, ["doctor", "--ds-config", str(cfg), "--model", "1b", *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return {c["name"]: c for c in json.loads(r.stdout)}


def terms(items: list[dict[str, Any]], key: str) -> list[tuple[str, int, str]]:
    return [(i["label"], i[key], i["phase"]) for i in items]


@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_plan_and_doctor_give_the_same_peak(tmp_path: Path, here_cpu: list[int], accelerator: str) -> None:
    cfg = defaults_1b(tmp_path)
    plan = plan_json(cfg, "--accelerator", accelerator)
    host = doctor_json(cfg, "--accelerator", accelerator)["host memory"]["data"]
    assert plan["host"]["peak_bytes"] == host["peak_bytes"] == host["total_peak_bytes"]
    assert terms(plan["host"]["items"], "nbytes") == terms(host["terms"], "bytes")
    assert sum(t["bytes"] for t in host["terms"] if t["in_peak"]) == host["peak_bytes"]
    assert (host["accelerator"], host["accelerator_source"]) == (accelerator, "given")
    assert (plan["inp"]["accelerator"], plan["inp"]["accelerator_source"]) == (accelerator, "given")
    # the process is counted where DeepSpeed here runs on the accelerator modelled (here: cpu)
    assert plan["inp"]["baseline_bytes"] == host["baseline_bytes"] == (BASELINE if accelerator == "cpu" else 0)


def test_the_1b_defaults_by_hand(tmp_path: Path, here_cpu: list[int]) -> None:
    """One rank of the 1b defaults (1,235,814,400 parameters in bf16; the embedding, 128,256 x 2,048, the
    largest tensor; one sub-group of them all, 1,003,012,096 elements aligned): on cuda the peak is step 1 (the
    swap buffers and Adam's moments); on cpu the process, the parameters, the reduce bucket (5e8 elements) and
    the forward's transients are host memory too, with one micro-batch's activations at the preset's 4,096
    tokens (52,766,441,472 B), so the peak moves to the forward and backward."""
    cfg = defaults_1b(tmp_path)
    cuda = doctor_json(cfg, "--accelerator", "cuda")["host memory"]["data"]
    resident = 1_235_814_400 * 2 + 4 * 1_003_012_096 * 4 + 270_336        # gradients, swap buffers, small tensors
    assert (cuda["peak_phase"], cuda["peak_bytes"]) == ("step 1", resident + 2 * 1_003_012_096 * 4)
    cpu = doctor_json(cfg, "--accelerator", "cpu")["host memory"]["data"]
    on_cpu = resident + BASELINE + 1_235_814_400 * 2 + 500_000_000 * 2
    forward = 2 * 262_668_288 * 2 + 52_766_441_472 + 500_000_000 * 2 + 500_000_000 * 4
    assert (cpu["peak_phase"], cpu["peak_bytes"]) == ("forward/backward", on_cpu + forward)
    assert {t["label"] for t in cpu["terms"] if t["on_device"]} == {
        "parameters", "gradient reduce bucket", "gathered parameters", "its gradient", "activations",
        "reduce-scatter copy of the bucket"}
    assert not [t for t in cuda["terms"] if t["on_device"]]


def test_each_says_which_accelerator_and_why(tmp_path: Path, here_cpu: list[int]) -> None:
    cfg = defaults_1b(tmp_path)
    plan = plan_json(cfg)
    assert (plan["inp"]["accelerator"], plan["inp"]["accelerator_source"], plan["inp"]["baseline_bytes"]) == (
        "cuda", "default", 0)
    assert here_cpu == []                     # plan's default measures nothing of this machine
    checks = doctor_json(cfg)
    acc = checks["accelerator"]
    assert (acc["status"], acc["data"]["name"], acc["data"]["source"]) == ("ok", "cpu", "detected")
    assert acc["detail"].startswith("modelled on the cpu accelerator (DeepSpeed's choice on this machine): its "
                                    "memory is the host's")
    assert checks["host memory"]["data"]["baseline_bytes"] == BASELINE
    r = CliRunner().invoke(cli, ["plan", "--model", "1b", "--ds-config", str(cfg)], env={"COLUMNS": "200"})
    assert ("Host memory modelled on the cuda accelerator (plan's default, a GPU job; --accelerator cpu models "
            "DeepSpeed's CPU accelerator)") in r.stdout
    assert ("Host-memory peak: 26.54 GB per rank; the process itself (torch + DeepSpeed): not counted without "
            "--accelerator (plan measures nothing of this machine then)") in r.stdout


def test_given_cuda_on_a_cpu_machine_leaves_the_process_out(tmp_path: Path, here_cpu: list[int]) -> None:
    data = doctor_json(defaults_1b(tmp_path), "--accelerator", "cuda")["host memory"]["data"]
    assert (data["baseline_bytes"], data["baseline_note"]) == (
        0, "not counted: DeepSpeed here runs on cpu, so no cuda process can be measured here")


@pytest.mark.parametrize("command", [["plan", "--model", "1b"], ["doctor", "--ds-config", "CFG"]])
def test_a_bad_accelerator_names_the_choices(tmp_path: Path, command: list[str]) -> None:
    cfg = defaults_1b(tmp_path)
    argv = [str(cfg) if a == "CFG" else a for a in command]
    r = CliRunner().invoke(cli, [*argv, "--accelerator", "tpu"])
    assert r.exit_code == 2
    assert "Invalid value for '--accelerator': 'tpu' is not one of 'cpu', 'cuda'." in r.stderr


def test_doctor_takes_accelerator_only_with_a_config() -> None:
    r = CliRunner().invoke(cli, ["doctor", "--accelerator", "cpu"])
    assert r.exit_code == 2
    assert "--accelerator goes with --ds-config FILE (the job's checks)" in r.stderr


def test_gds_on_the_cpu_accelerator_is_named(tmp_path: Path, here_cpu: list[int]) -> None:
    cfg = defaults_1b(tmp_path, use_gds=True)
    checks = doctor_json(cfg, "--accelerator", "cpu")
    assert checks["accelerator"]["detail"].endswith("; aio.use_gds needs CUDA: DeepSpeed refuses it here")
    assert checks["accelerator"]["data"]["use_gds"] is True
    assert checks["ds_config"]["status"] == "fail" and "aio-gds-no-cuda" in checks["ds_config"]["data"]["rules"]
    r = CliRunner().invoke(cli, ["plan", "--model", "1b", "--ds-config", str(cfg), "--accelerator", "cpu"],
                           env={"COLUMNS": "200"})
    assert "aio.use_gds needs CUDA: DeepSpeed refuses it on the cpu accelerator (set it to false)" in r.stdout


def test_every_check_carries_its_numbers(tmp_path: Path, here_cpu: list[int]) -> None:
    """doctor --json: each check has `data`; free space's need is plan's NVMe capacity, to the byte."""
    cfg = defaults_1b(tmp_path)
    checks = doctor_json(cfg, "--accelerator", "cpu")
    assert all(isinstance(c["data"], dict) for c in checks.values())
    space = checks[f"free space on {tmp_path / 'swap'}"]["data"]
    assert space["need_bytes"] == plan_json(cfg, "--accelerator", "cpu")["nvme_capacity_bytes"]
    assert space["have_bytes"] == space["free_bytes"] + space["reusable_bytes"]
    assert checks[f"O_DIRECT on {tmp_path / 'swap'}"]["data"]["alignment_bytes"] == 1024
    host = checks["host memory"]["data"]
    assert host["budget_bytes"] == min(b for b in (host["ram_bytes"], host["available_bytes"],
                                                   host["cgroup_limit_bytes"]) if b)
    fit = host_fit(host["total_peak_bytes"], host["budget_bytes"])
    assert (host["verdict"], host["margin"], checks["host memory"]["status"]) == (
        fit.verdict, fit.margin, DOCTOR_STATUS[fit.verdict])


def test_seq_len_sizes_the_activations_the_same_in_both(tmp_path: Path, here_cpu: list[int]) -> None:
    """--seq-len 128 (the tokens the seed-scale job trains on): 16 layers x 128 x 2,048 x (34 + 5 x 32 x 128 //
    2,048) B in bf16, and the logits (128 x 128,256 x (2 + 8) B)."""
    cfg = defaults_1b(tmp_path)
    acts = 16 * 128 * 2048 * (34 + 5 * 32 * 128 // 2048) + 128 * 128_256 * 10
    assert acts == 348_717_056
    plan = plan_json(cfg, "--accelerator", "cpu", "--seq-len", "128")
    host = doctor_json(cfg, "--accelerator", "cpu", "--seq-len", "128")["host memory"]["data"]
    assert plan["host"]["peak_bytes"] == host["peak_bytes"]
    [term] = [t for t in host["terms"] if t["label"] == "activations"]
    assert term["bytes"] == acts and "x 128 tokens (--seq-len) in bf16" in term["formula"]
    assert "x 128 tokens (--seq-len)" in plan["inp"]["activation_note"]
    # the forward's transients (the embedding gathered and its gradient, the activations, the bucket's copies)
    # now stay under step 1's Adam moments, which become the peak again, as on cuda
    forward = 2 * 262_668_288 * 2 + acts + 500_000_000 * 2 + 500_000_000 * 4
    on_cpu = 1_235_814_400 * 2 + 4 * 1_003_012_096 * 4 + 270_336 + BASELINE + 1_235_814_400 * 2 + 500_000_000 * 2
    assert forward < 2 * 1_003_012_096 * 4
    assert (host["peak_phase"], host["peak_bytes"]) == ("step 1", on_cpu + 2 * 1_003_012_096 * 4)


@pytest.mark.parametrize("argv", [["plan", "--params", "1B", "--seq-len", "128"],
                                  ["doctor", "--ds-config", "ds.json", "--params", "1B", "--seq-len", "128"]])
def test_seq_len_without_a_preset_is_refused(argv: list[str]) -> None:
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2
    assert r.stderr.endswith("--seq-len sizes the activations of a --model preset: add --model PRESET (a --params "
                             "count has no shape to size them from)\n"), r.stderr


def test_doctor_seq_len_goes_with_a_ds_config() -> None:
    r = CliRunner().invoke(cli, ["doctor", "--seq-len", "128"])
    assert r.exit_code == 2 and "--seq-len goes with --ds-config FILE" in r.stderr, r.stderr
