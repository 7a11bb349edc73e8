"""`iotune sweep offload` on real steps of the built-in workload, on the
built-in test bed: every candidate that runs is one the offload model lets
through, none crashes on a DeepSpeed bound, each trial's locked memory is
the predicted one to the byte, and bad input is refused with the fix."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.host_memory import host_memory
from iotune.workloads.presets import PRESETS, tensor_numels

from tests.conftest import needs_deepspeed, needs_fio, needs_root
from tests.project.test_schemas import conforms

NVME = ["--fix", "zero_optimization.offload_optimizer.device=nvme", "--fix", "zero_optimization.offload_param.device=none"]


@needs_fio
@needs_root
@needs_deepspeed
def test_pinned_to_nvme_the_search_runs_pipelined_candidates_with_the_buffers_they_need(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", *NVME, "--fix",
                                 "zero_optimization.sub_group_size=1e6", "--max-trials", "1", "--max-pairs", "1",
                                 "--what-if", "grad_accum=1", "-o", str(tmp_path), "--json"])
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)
    conforms("sweep-offload-3", doc)
    assert doc["model"] == "the built-in tiny model (sequence 128)"
    assert [d["key"] for d in doc["searched"]] == ["zero_optimization.offload_optimizer.pipeline_read",
                                                   "zero_optimization.offload_optimizer.pipeline_write"]
    # the unpipelined candidate only cuts the state: ranked on replays when they reproduce the step (the replay
    # ranking's own tests: test_offload_replay.py); every other fitting candidate is predicted before any runs,
    # and real steps go to the predicted fastest (--max-trials 1)
    replayed = [r["changes"] for r in doc["replay"]["ranked"]]
    assert replayed == ([{"zero_optimization.sub_group_size": 1_000_000}] if doc["replay"]["can_rank"] else [])
    predicted = [p["step_s"] for p in doc["predictions"]]
    assert len(predicted) == 4 - len(replayed) and predicted == sorted(predicted) and \
        [p["run"] for p in doc["predictions"]] == [True] + [False] * (len(predicted) - 1)
    search = [t for t in doc["trials"] if t["role"] == "search"]
    assert [t["key"] for t in search] == [doc["predictions"][0]["key"]]
    assert all(t["status"] == "ok" for t in doc["trials"]), doc["trials"]
    # pipelining both ways moves the same bytes fastest: the model puts it first, with the buffers it needs
    assert [t["changes"] for t in search] == [{"zero_optimization.sub_group_size": 1_000_000,      # --fix'd
                                                "zero_optimization.offload_optimizer.pipeline_read": True,
                                                "zero_optimization.offload_optimizer.pipeline_write": True,
                                                "zero_optimization.offload_optimizer.buffer_count": 12}]
    [reference] = [t for t in doc["trials"] if t["role"] == "reference"]
    assert reference["changes"] == {} and doc["reference_changes"] == {} and doc["base_over"] == []
    for t in doc["trials"]:
        assert t["ran"] == doc["model"]
        assert t["locked_bytes"] == t["predicted_locked_bytes"] > 0, t
        assert t["peak_rss_bytes"] > 0 and t["predicted_host_bytes"] > 0
        assert t["tokens_per_s"] == t["samples_per_s"] * PRESETS["tiny"].seq_len
        # every byte the swapper handed to aio on the steady steps, as the hook saw it, is the predicted one
        assert sum(t["swap_bytes"].values()) == t["predicted_swap_bytes"] > 0, t
        assert set(t["swap_bytes"]) == {"optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq", "gradients"}, t
        assert 0 < t["io_wait_s"] < t["step_s"], t        # blocked on swaps (optimizer step and backward), within the step
        # step_times_s are recorded to the microsecond (rounded to 6 places), step_s is their unrounded median
        assert 2 <= len(t["step_times_s"]) <= 3
        assert t["step_s"] == pytest.approx(statistics.median(t["step_times_s"]), rel=0, abs=5e-7)
    assert all(t["predicted_step_s"] > 0 for t in search) and doc["step_error"] is not None
    # pipelining moves the same bytes: a gain it makes is faster I/O only
    assert doc["gain"] is None if doc["verdict"] != "faster" else (
        doc["gain"]["saved_bytes_per_step"] == 0 and "all of it from faster I/O" in doc["gain"]["sentence"])
    shape = JobShape(tuple(tensor_numels(PRESETS["tiny"])))
    both = OffloadKnobs(optimizer_device="nvme", sub_group_size=1_000_000, pipeline_read=True, pipeline_write=True,
                        optimizer_buffer_count=12)
    assert search[0]["predicted_locked_bytes"] == host_memory(both, shape).locked_bytes
    # plan counts, for the job's own config (the built-in one), the bytes this search predicted and the hook counted
    from iotune.workloads.strategies import WorkloadSpec, ds_config
    own = tmp_path / "own.json"
    own.write_text(json.dumps(ds_config(WorkloadSpec(strategy="nvme-opt", size="tiny", nvme_path=str(tmp_path)))))
    plan = json.loads(CliRunner().invoke(cli, ["plan", "--model", "tiny", "--ds-config", str(own), "--json"]).stdout)
    moved = sum(plan["per_optimizer_step"]["read"].values()) + sum(plan["per_optimizer_step"]["write"].values())
    assert moved == reference["predicted_swap_bytes"] == sum(reference["swap_bytes"].values())
    # --max-pairs 1: the pick goes to the pairs (no unpaired gate), and one pair has no noise estimate: undecided
    pair_trials = [t for t in doc["trials"] if t["role"].startswith("pair-")]
    assert [t["pair_order"] for t in pair_trials] == ["candidate-first"] * 2
    assert (doc["verdict"], doc["more_pairs"], doc["gain"]) == ("undecided", 2, None)
    lines = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "header" and sum(r["kind"] == "offload-trial" for r in lines) == len(doc["trials"])
    assert sum(r["kind"] == "offload-probe" for r in lines) == 1        # the model's start, up to initialize
    # the what-if at the config's own value (grad_accum 1) on the kept config (undecided: yours) is the reference
    # trial's measurement, not a trial of its own
    assert [t for t in doc["trials"] if t["role"] == "what-if"] == []
    assert [(w["value"], w["samples_per_s"]) for w in doc["what_if"]] == [(1, reference["samples_per_s"])]
    assert "what-if gradient_accumulation_steps = 1 is the config's own value: its reference trial measured it" in \
        r.stderr
    again = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", *NVME, "--fix",
                                     "zero_optimization.sub_group_size=1e6", "--max-trials", "1", "--max-pairs", "1",
                                     "--what-if", "grad_accum=1", "-o", str(tmp_path), "--json"])
    resumed = json.loads(again.stdout)
    assert resumed["trials"] == doc["trials"] and resumed["trials_run_now"] == 0       # resumed: nothing ran again
    assert "s/step (" not in again.stderr
    assert "offload: starting" not in again.stderr and \
        "up to deepspeed.initialize: from the journal (the start that showed it is not run again)" in again.stderr


@needs_fio
@needs_root
@needs_deepspeed
def test_where_ram_holds_the_state_the_optimizer_in_ram_runs_first_and_its_gain_is_less_io(tmp_path: Path) -> None:
    """Unpinned, the cost model runs the optimizer in RAM first (no bytes on
    the drive): that trial swaps nothing and never waits on I/O, and the
    config it is paired with swaps exactly what the model predicts. One
    pair: undecided (the rule's own tests decide from more; how a gain
    splits into less and faster I/O: tests/model/test_offload_model.py)."""
    # sub_group_size pinned: every candidate then changes the device or pipelines, which the replay does not
    # represent, so no replay runs, not even the fidelity check
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--fix",
                                 "zero_optimization.offload_param.device=none", "--fix",
                                 "zero_optimization.sub_group_size=1e9", "--max-trials", "1",
                                 "--max-pairs", "1", "-o", str(tmp_path), "--json"])
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)
    conforms("sweep-offload-3", doc)
    assert doc["predictions"][0]["changes"] == {"zero_optimization.offload_optimizer.device": "cpu"}
    replay = doc["replay"]
    assert (replay["can_rank"], replay["ranked"], replay["traced_ratio"]) == (False, [], 0.0)
    assert replay["fidelity"] == "no replay: no candidate changes only what the replay represents, so each runs real steps"
    assert {"changes": "offload_optimizer.device=cpu",
            "why": "it moves state to another device: compute and memory change, not only the swaps"} in replay["real_steps"]
    assert "replaying your config's step" not in r.stderr
    [search] = [t for t in doc["trials"] if t["role"] == "search"]
    assert search["changes"] == {"zero_optimization.offload_optimizer.device": "cpu"}, search
    assert search["status"] == "ok" and search["swap_bytes"] == {} and search["io_wait_s"] == 0.0
    assert search["predicted_swap_bytes"] == 0 and search["locked_bytes"] == search["predicted_locked_bytes"] == 0
    bases = [t for t in doc["trials"] if t["role"] in ("pair-base", "reference")]
    assert [b["role"] for b in bases] == ["reference", "pair-base"]
    assert all(sum(b["swap_bytes"].values()) == b["predicted_swap_bytes"] > 0 for b in bases)
    assert all(b["io_wait_s"] > 0 for b in bases)
    [paired] = [t for t in doc["trials"] if t["role"] == "pair-candidate"]
    assert paired["changes"] == search["changes"] and paired["swap_bytes"] == {}
    assert (doc["verdict"], doc["gain"]) == ("undecided", None)


@needs_root
@needs_deepspeed      # the built-in model's shape probe measures its baseline (a short DeepSpeed start)
def test_a_budget_nothing_fits_in_refuses_every_candidate_with_the_numbers(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--fix",
                                 "zero_optimization.offload_optimizer.device=cpu", "--fix",
                                 "zero_optimization.offload_param.device=none", "--max-host-memory", "1MiB",
                                 "-o", str(tmp_path)])
    assert r.exit_code == 1
    assert "of host memory at its peak (" in r.stdout and "over 1.0 MiB (--max-host-memory)" in r.stdout
    assert f"optimizer state in RAM {16 * PRESETS['tiny'].param_count() / 2**20:.1f} MiB" in r.stdout
    assert "Keeping your config: no candidate could run" in r.stdout
    # the job's own config is over the same budget, and is said to be
    [own] = [line for line in r.stderr.splitlines() if line.startswith("offload: the job's own config does not fit")]
    assert own.endswith("over 1.0 MiB (--max-host-memory). No candidate fits either"), own   # yours: no margin
    json_run = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--fix",
                                        "zero_optimization.offload_optimizer.device=cpu", "--fix",
                                        "zero_optimization.offload_param.device=none", "--max-host-memory", "1MiB",
                                        "-o", str(tmp_path), "--json"])
    conforms("sweep-offload-3", json.loads(json_run.stdout))


@needs_deepspeed      # the built-in model's shape probe measures its baseline (a short DeepSpeed start)
def test_a_config_without_zero3_says_which_dimensions_apply(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--ds-config", str(cfg), "--path",
                                 str(tmp_path), "-o", str(tmp_path / "j")])
    assert r.exit_code == 1, r.output
    assert ("left out: zero_optimization.offload_optimizer.device: ZeRO stage 2: DeepSpeed turns `device: nvme` "
            "into CPU offload there; these knobs exist in stage 3 only") in r.stdout
    assert "Nothing to search: every dimension is left out (above); keeping your config" in r.stdout


@pytest.mark.parametrize("argv,says", [
    (["offload", "--fix", "zero_optimization.sub_grup_size=1e8"],
     "did you mean zero_optimization.sub_group_size?"),
    (["offload", "--drives", "2"], "--drives is not an option of `iotune sweep offload`: it belongs to `iotune sweep "
                                   "layouts`"),
    (["offload", "--steps-cmd", "python train.py {config}"], "--steps-cmd needs --ds-config FILE"),
    (["--max-host-memory", "1G"], "--max-host-memory is not an option of `iotune sweep aio`: it belongs to `iotune "
                                  "sweep offload`"),
    (["offload", "--model", "huge"], "unknown --model 'huge'"),
])
def test_bad_input_names_the_fix(argv: list[str], says: str) -> None:
    r = CliRunner().invoke(cli, ["sweep", *argv])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output


@needs_root
@needs_deepspeed
def test_the_what_if_reports_gradient_accumulation_without_applying_it(tmp_path: Path) -> None:
    """Everything pinned (nothing to search), so the what-if runs the job's
    own config at 1 and 4 micro-steps per step: the drive bytes per sample
    fall exactly 4x (the optimizer state moves once per optimizer step), and
    the optimizer takes a smaller share of the step; nothing is applied."""
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", *NVME, "--fix",
                                 "zero_optimization.sub_group_size=1e9", "--what-if", "grad_accum=1,4", "-o",
                                 str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    conforms("sweep-offload-3", doc)
    one, four = doc["what_if"]
    assert (one["key"], one["value"], four["value"]) == ("gradient_accumulation_steps", 1, 4)
    assert one["status"] == four["status"] == "ok"
    per_step = 2 * 4 * 3 * PRESETS["tiny"].param_count() + 2 * 2 * (1 << 20)   # 3 states + 2 gradients, each way
    assert one["nvme_bytes_per_sample"] == per_step / 4 and four["nvme_bytes_per_sample"] == per_step / 16
    assert four["optimizer_share"] < one["optimizer_share"]
    assert doc["recommended"] == {} and doc["config"]["gradient_accumulation_steps"] == 1      # not applied


@needs_fio
@needs_root
@needs_deepspeed
def test_the_users_own_command_and_config_are_the_loop(tmp_path: Path) -> None:
    """--steps-cmd with --offload: a first run of the user's command with
    its own config shows iotune the model's tensors (through the startup
    hook), then each candidate's config copy runs the same command. The
    locked memory the model predicts from the tensors the hook saw is the
    one each run locked, and equals the prediction from the tiny preset's
    own tensors: the hook saw the same model."""
    from iotune.workloads.strategies import WorkloadSpec, ds_config

    cfg = tmp_path / "my_ds_config.json"
    own = ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path=str(tmp_path / "mine")))
    own["zero_optimization"]["sub_group_size"] = 1_000_000
    cfg.write_text(json.dumps(own))
    command = f"{sys.executable} -W ignore -m iotune.workloads.train --steps 50 --ds-config {{config}}"
    # sub_group_size pinned at the config's own: the candidates only pipeline, which the replay does not
    # represent, so none is replayed
    r = CliRunner().invoke(cli, ["sweep", "offload", "--steps-cmd", command, "--ds-config", str(cfg), *NVME,
                                 "--fix", "zero_optimization.sub_group_size=1e6", "--max-trials", "1",
                                 "--max-pairs", "1", "--steps", "3", "-o", str(tmp_path / "journal"), "--json"])
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)
    conforms("sweep-offload-3", doc)
    assert doc["model"] == f"`{command}`"
    assert "starting `" in r.stderr and "up to deepspeed.initialize, to see its tensors" in r.stderr
    assert all(t["status"] == "ok" for t in doc["trials"]), doc["trials"]
    [search] = [t for t in doc["trials"] if t["role"] == "search"]
    assert doc["replay"]["ranked"] == [] and "replaying your config's step" not in r.stderr
    both = OffloadKnobs(optimizer_device="nvme", sub_group_size=1_000_000, pipeline_read=True, pipeline_write=True,
                        optimizer_buffer_count=12)
    expected = host_memory(both, JobShape(tuple(tensor_numels(PRESETS["tiny"])))).locked_bytes
    assert search["predicted_locked_bytes"] == search["locked_bytes"] == expected
    assert not (tmp_path / "mine").exists()         # each config copy swaps to the trial's own directory
