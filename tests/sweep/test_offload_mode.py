"""`iotune sweep offload` as a mode of the sweep: which job it may tune
(never a built-in model standing in for yours), its journal's identity,
and the host-memory model it refuses candidates with, against figures
measured on this machine (the 1B preset's locked memory, exact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.planner import make_plan
from iotune.cli import cli
from iotune.model.host_memory import HostContext, host_memory
from iotune.model.journal import SweepEnv
from iotune.model.offload import JobShape, OffloadKnobs, step_swap_bytes
from iotune.model.offload_result import OffloadTrial
from iotune.model.plan import PlanInput
from iotune.sweep.journal import open_journal
from iotune.workloads.presets import PRESETS, tensor_numels

ONE_B = JobShape(tuple(tensor_numels(PRESETS["1b"])))
BF16_NVME = OffloadKnobs(optimizer_device="nvme", dtype="bf16")


@pytest.mark.parametrize("argv,says", [
    (["--ds-config", "{cfg}"],
     "--ds-config {cfg} without --steps-cmd would tune a built-in model with your config, not your model: give "
     "--steps-cmd \"YOUR TRAINING COMMAND ... {{config}}\" to run your own job, or name a built-in model with "
     "--model PRESET to tune that one on purpose"),
    (["--apply", "{cfg}"],
     "--apply {cfg} would write what a built-in model's trials chose into your config: give --steps-cmd (with "
     "--ds-config) so the trials run your own job, or name the built-in model with --model to apply its result on "
     "purpose"),
    (["--model", "tiny", "--steps-cmd", "python train.py {{config}}", "--ds-config", "{cfg}"],
     "--model names a built-in model, and --steps-cmd runs your own: give one of them"),
    (["--seq-len", "64", "--steps-cmd", "python train.py {{config}}", "--ds-config", "{cfg}"],
     "--seq-len sets the built-in model's sequence: your command (--steps-cmd) sets its own"),
    (["--model", "tiny", "--steps", "2"], "--steps 2: a trial needs at least 3 optimizer steps (the first creates "
     "Adam's moments and is left out; two steady ones must agree)"),
    (["--model", "tiny", "--grid"], "--grid is not an option of `iotune sweep offload`: it belongs to `iotune sweep "
                                    "aio`, `iotune sweep layouts` and `iotune sweep netfs`"),
])
def test_no_path_tunes_a_model_other_than_yours(tmp_path: Path, argv: list[str], says: str) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    r = CliRunner().invoke(cli, ["sweep", "offload", *[a.format(cfg=cfg) for a in argv]])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines()[-1] == f"Error: {says.format(cfg=cfg)}"


def env(config_sha1: str, version: str = "0.1.0") -> SweepEnv:
    return SweepEnv(executor="offload", drive={"fs": "uuid-1"}, steps_cmd={"model": "tiny"}, mode="offload",
                    config_sha1=config_sha1, iotune_version=version)


def trial(key: str = "{}") -> OffloadTrial:
    return OffloadTrial(key, {}, "ok", "", 1.0, 0.5, 1.0, role="reference")


def test_an_edited_config_starts_a_new_journal_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    first = open_journal(tmp_path, False, env("aaaa"), said.append)
    first.record_offload(trial())
    again = open_journal(tmp_path, False, env("aaaa"), said.append)
    assert again.find_offload("{}", "reference", 0) == trial() and said == []          # the same identity resumes
    edited = open_journal(tmp_path, False, env("bbbb"), said.append)
    assert edited.offload_trials == [] and edited.env == env("bbbb")
    [kept] = sorted(tmp_path.glob("journal.*.jsonl"))
    assert said == [f"sweep: the journal in {tmp_path} was recorded with config_sha1 'aaaa', not 'bbbb': starting a "
                    f"new one (the old one is kept as {kept.name})"]
    assert open_journal(tmp_path, False, env("bbbb", "0.2.0"), said.append).offload_trials == []   # a new iotune too
    assert "recorded with iotune_version '0.1.0', not '0.2.0'" in said[-1]


def test_fresh_keeps_the_old_journal_and_a_torn_line_is_run_again(tmp_path: Path) -> None:
    j = open_journal(tmp_path, False, env("aaaa"))
    j.record_offload(trial())
    with (tmp_path / "journal.jsonl").open("a") as fh:
        fh.write('{"kind": "offload-trial", "key": "{\\"x\\"')                       # a kill mid-write
    resumed = open_journal(tmp_path, False, env("aaaa"))
    assert [t.key for t in resumed.offload_trials] == ["{}"]
    resumed.record_offload(trial('{"y": 1}'))                                         # appended on a line of its own
    assert [t.key for t in open_journal(tmp_path, False, env("aaaa")).offload_trials] == ["{}", '{"y": 1}']
    fresh = open_journal(tmp_path, True, env("aaaa"))
    assert fresh.offload_trials == []
    [kept] = tmp_path.glob("journal.*.jsonl")
    assert len(kept.read_text().splitlines()) == 4                                    # header, 2 trials, the torn line


def test_the_1b_presets_locked_memory_is_what_deepspeed_locked_here() -> None:
    """Measured on this machine (Llama 3.2 1B shape, bf16, optimizer on NVMe;
    VmLck after deepspeed.initialize): 16,048,193,536 B with DeepSpeed's
    default sub_group_size, 4,202,692,608 B with 1e8, where the 262.7 M
    element embedding is a sub-group by itself."""
    assert PRESETS["1b"].param_count() == 1_235_814_400
    assert host_memory(BF16_NVME, ONE_B).locked_bytes == 16_048_193_536
    assert host_memory(OffloadKnobs(optimizer_device="nvme", dtype="bf16", sub_group_size=100_000_000),
                       ONE_B).locked_bytes == 4_202_692_608


def test_deepspeeds_defaults_at_1b_do_not_fit_this_machine_and_1e8_does() -> None:
    """24 GiB of RAM: the defaults were OOM-killed here in the first step
    (24.1 GB of RSS); sub_group_size 1e8 ran at 14.6 GB."""
    here = HostContext("cpu", 330_000_000)
    defaults = host_memory(BF16_NVME, ONE_B, here)
    fits = host_memory(OffloadKnobs(optimizer_device="nvme", dtype="bf16", sub_group_size=100_000_000), ONE_B, here)
    assert defaults.peak_bytes > 24 << 30 > fits.peak_bytes
    assert defaults.peak_phase() == "step 1"          # Adam's moments of a 1e9-element sub-group, created lazily


def test_plan_counts_the_bytes_the_sweep_predicts(tmp_path: Path) -> None:
    """One model of DeepSpeed's swapper: plan's bytes per step for a config
    are what `sweep offload` predicts for it (and checks against the
    startup hook's count on every trial, tests/sweep/test_offload_search.py)."""
    cfg = {"bf16": {"enabled": True}, "aio": {"block_size": 4 << 20},
           "zero_optimization": {"stage": 3, "sub_group_size": 10_000_000,
                                 "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["plan", "--model", "small", "--ds-config", str(path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    knobs, shape = OffloadKnobs.from_ds_config(cfg), JobShape(tuple(tensor_numels(PRESETS["small"])))
    each_way = sum(step_swap_bytes(knobs, shape).values())
    step = doc["per_optimizer_step"]
    assert sum(step["read"].values()) == sum(step["write"].values()) == each_way > 0
    assert doc["inp"]["pinned_buffer_bytes"] == host_memory(knobs, shape).locked_bytes
    assert make_plan(PlanInput(params=shape.params_total, numels=shape.numels, knobs=knobs)).per_optimizer_step \
        .total_read == each_way


@pytest.mark.parametrize("name,expected", [
    ("aio", ["Drive:", "aio search:", "Training steps (your job, or a built-in model):", "Multi-node:", "Journal:",
             "Apply:", "Output:", "Options:"]),
    ("offload", ["Drive:", "Your job (or a built-in model):", "Offload search:", "Journal:", "Apply:", "Output:",
                 "Options:"]),
    ("checkpoint", ["Drive:", "Your job (or a built-in model):", "Checkpoints:", "Journal:", "Apply:", "Output:",
                    "Options:"]),
    ("layouts", ["Layouts:", "aio search:", "Journal:", "Output:", "Options:"]),
])
def test_sweep_help_lists_each_subcommands_options_by_group(name: str, expected: list[str]) -> None:
    r = CliRunner().invoke(cli, ["sweep", name, "--help"])
    sections = [line for line in r.stdout.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert sections == expected
