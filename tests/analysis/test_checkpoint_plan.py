"""`iotune plan`'s checkpoint rows: hand-computed cases, --keep against the
drives' capacity, --checkpoint-every in the time per step and the wear
forecast, and the CLI's messages."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from iotune.analysis.checkpoint_plan import check_space, checkpoint_plan, plan_knobs
from iotune.analysis.endurance import plan_endurance
from iotune.analysis.planner import make_plan
from iotune.cli import cli
from iotune.errors import UsageError
from iotune.model.offload import JobShape
from iotune.model.plan import PlanInput
from iotune.workloads.presets import PRESETS, tensor_numels

B16 = PRESETS["16b"].param_count()
SCRIPTS = 38_580 + 2_490


def test_16b_nvme_opt_checkpoint_by_hand() -> None:
    plan = make_plan(PlanInput(params=B16, strategy="nvme-opt", drive_bytes_per_s=3e9, drives=3))
    cp = checkpoint_plan(plan, JobShape.approximate(B16, None), keep=2, every_steps=50)
    assert cp.parts == {"model states": 0, "offloaded tensors": 12 * B16, "optimizer partitions": 0,
                        "recovery scripts": SCRIPTS, "latest": len("global_step1")}
    assert cp.rank_bytes == 12 * B16 + SCRIPTS + 12
    # the copy reads the swap files and writes the checkpoint, on the same 3 drives
    assert cp.save_s == pytest.approx((24 * B16 + SCRIPTS + 12) / 9e9) and cp.load_s == cp.save_s
    assert cp.space_bytes == 16 * B16 + 2 * cp.rank_bytes
    assert cp.seconds_per_step == pytest.approx(cp.save_s / 50)
    assert cp.written_bytes_per_step == pytest.approx(cp.rank_bytes / 50)


def test_zero_2_cpu_offload_saves_the_model_and_the_optimizer_partitions() -> None:
    plan = make_plan(PlanInput(params=B16, strategy="cpu", precision="bf16", gpus=8))
    cp = checkpoint_plan(plan, JobShape.approximate(B16, None, ranks=8))
    assert plan_knobs(plan.inp).stage == 2
    assert cp.parts["model states"] == 2 * B16                     # bf16, data-parallel rank 0 alone
    assert cp.parts["optimizer partitions"] == 12 * B16           # 12 B x params / 8, on each of the 8 ranks
    assert "offloaded tensors" not in cp.parts and cp.save_s is None


def test_checkpoints_add_to_the_wear_forecast() -> None:
    plan = make_plan(PlanInput(params=B16, strategy="nvme-opt", drive_bytes_per_s=3e9))
    cp = checkpoint_plan(plan, JobShape.approximate(B16, None), every_steps=10)
    plain, with_ckpt = plan_endurance(plan, 60.0), plan_endurance(plan, 60.0, checkpoint=cp)
    assert plain is not None and with_ckpt is not None
    added = with_ckpt.figures["written_bytes_per_hour"] - plain.figures["written_bytes_per_hour"]
    assert added == pytest.approx(cp.rank_bytes / 10 / 60 * 3600)
    assert "checkpoints included" in with_ckpt.rule
    # without --step-time the step is the storage time plus its share of the save
    bound = plan_endurance(plan, None, checkpoint=cp)
    assert bound is not None and f"every {plan.storage_s_per_step + cp.seconds_per_step:,.2f} s" in bound.rule


def test_keep_beyond_the_drives_is_refused_with_the_numbers() -> None:
    plan = make_plan(PlanInput(params=B16, strategy="nvme-opt"))
    cp = checkpoint_plan(plan, JobShape.approximate(B16, None), keep=40)
    with pytest.raises(UsageError) as e:
        check_space(cp, 3.84e12, 1)
    assert str(e.value) == ("--keep 40: 40 checkpoint(s) of 190.16 GB (rank 0) beside 253.55 GB of swap files need "
                            "7.86 TB per rank, more than its 1 drive(s) of 3.84 TB hold (3.84 TB): keep at most 18, "
                            "or give the checkpoints another directory (and drop --keep here)")
    check_space(cp, 3.84e12, 3)                                        # 11.52 TB on 3 drives: fits
    check_space(checkpoint_plan(plan, JobShape.approximate(B16, None), keep=18), 3.84e12, 1)


def test_plan_cli_prints_the_checkpoint_and_refuses_a_keep_that_does_not_fit() -> None:
    r = CliRunner().invoke(cli, ["plan", "--model", "tiny", "--drive-bandwidth", "200MB/s", "--keep", "3",
                                 "--checkpoint-every", "10"])
    assert r.exit_code == 0, r.output
    tiny = sum(tensor_numels(PRESETS["tiny"]))
    assert "One checkpoint (DeepSpeed save_checkpoint)" in r.stdout and "offloaded tensors" in r.stdout
    assert "Space with --keep 3:" in r.stdout and "A checkpoint every 10 steps adds" in r.stdout
    doc = json.loads(CliRunner().invoke(cli, ["plan", "--model", "tiny", "--keep", "3", "--json"]).stdout)
    assert doc["checkpoint"]["parts"]["offloaded tensors"] == 12 * tiny and doc["checkpoint"]["keep"] == 3
    r = CliRunner().invoke(cli, ["plan", "--model", "16b", "--keep", "40", "--drive-capacity", "3.84TB"])
    assert r.exit_code == 2 and "keep at most 18" in r.stderr and "Traceback" not in r.output
