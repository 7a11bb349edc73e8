"""The planner against the published 16B table of "Does AI model offloading
matter?" (https://xinnor.io/blog/does-ai-model-offloading-matter-benchmarking-ram-and-nvme-strategies-for-llm-training/; the only
large-scale measurement we have: DeepSpeed 0.18.3, one GPU, bf16, Adam,
optimizer state on one NVMe; "GB" in the table are GiB: 325,488 reads and
650,993 writes of 512 KiB are 158.9 and 317.9 GiB).

The document does not give its model's configuration. Its space column
fixes the size: 211.9 GiB at 16 B per parameter (DeepSpeed's 12 B of
optimizer state + 4 B of gradient swap files) is 14.22e9 parameters, and
the parameters-on-NVMe case (238.4 GiB at 18 B) gives the same count, so
one fitted number explains both space figures."""

from __future__ import annotations

import pytest

from iotune.analysis.planner import make_plan
from iotune.model.plan import PlanInput

GIB = 2**30
KIB512 = 512 * 1024
DOC_SPACE_OPT_GIB = 211.9            # case 1: optimizer state on one NVMe
DOC_SPACE_ALL_GIB = 238.4            # case 3: parameters + optimizer state
DOC_READS_512K, DOC_WRITES_512K = 325_488, 650_993      # case 1, per step
DOC_PARAMS = round(DOC_SPACE_OPT_GIB * GIB / 16)          # 14.22e9, fitted from case 1's space


def test_the_table_is_in_gib() -> None:
    """Two columns of the table agree only in GiB: request counts x 512 KiB and the volumes."""
    assert DOC_READS_512K * KIB512 / GIB == pytest.approx(158.9, abs=0.05)
    assert DOC_WRITES_512K * KIB512 / GIB == pytest.approx(317.9, abs=0.05)


def test_both_space_figures_give_one_model_size() -> None:
    """Case 3 at 18 B per parameter (case 1's 16 B + 2 B of bf16 weights) gives the count case 1 gives:
    the table's two space figures describe one model, the fit is not a coincidence of one number."""
    assert DOC_SPACE_ALL_GIB * GIB / 18 == pytest.approx(DOC_PARAMS, rel=1e-3)


def test_space_reproduces_both_cases() -> None:
    """The planner's NVMe bytes per parameter, derived by hand from DeepSpeed's swappers: fp32 master
    weights 4 B, Adam's two moments 8 B, fp32 gradient swap files 4 B (16 B); with the weights on NVMe
    too, their bf16 copy adds 2 B (18 B). Case 1 fixed the model size; case 3 is then a prediction."""
    opt = make_plan(PlanInput(params=DOC_PARAMS, strategy="nvme-opt"))
    every = make_plan(PlanInput(params=DOC_PARAMS, strategy="nvme-all"))
    by_hand = {"master weights": 4 * DOC_PARAMS, "Adam moments": 8 * DOC_PARAMS, "gradients (fp32)": 4 * DOC_PARAMS}
    assert opt.memory["NVMe"] == pytest.approx(by_hand, rel=1e-8)                # up to O_DIRECT padding
    assert opt.nvme_capacity_bytes == pytest.approx(16 * DOC_PARAMS, rel=1e-8)
    assert every.memory["NVMe"]["weights"] == pytest.approx(2 * DOC_PARAMS, rel=1e-8)
    assert every.nvme_capacity_bytes == pytest.approx(18 * DOC_PARAMS, rel=1e-8)
    assert every.nvme_capacity_bytes == pytest.approx(DOC_SPACE_ALL_GIB * GIB, rel=5e-3)


def test_bytes_moved_per_step_within_twelve_percent() -> None:
    """Read + write per optimizer step: DeepSpeed's source reads and writes
    16 B per parameter (12 B state + 4 B gradients each way, in
    partitioned_optimizer_swapper.py swap_in_optimizer_state /
    swap_out_optimizer_state and the gradient swap-out in stage3.py
    partition_grads); the published table measured 36 B (12 B read, 24 B written).
    The total agrees within 12 %; the read/write split does not (see docs/guide/plan-lint.md)."""
    plan = make_plan(PlanInput(params=DOC_PARAMS, strategy="nvme-opt"))
    doc_moved = (DOC_READS_512K + DOC_WRITES_512K) * KIB512
    moved = plan.per_optimizer_step.total_read + plan.per_optimizer_step.total_write
    assert moved == pytest.approx(32 * DOC_PARAMS, rel=1e-8)                     # O_DIRECT padding
    assert abs(moved - doc_moved) / doc_moved < 0.12
    assert plan.per_optimizer_step.total_read == plan.per_optimizer_step.total_write


def test_parameter_fetches_scale_with_accumulation() -> None:
    """With the weights on NVMe, every micro-step fetches them for forward and
    again for backward; they are written once, after the update."""
    p = 1 << 30                           # whole tensors of 128 Mi elements: no padding
    one = make_plan(PlanInput(params=p, strategy="nvme-all", grad_accum=1)).per_optimizer_step
    four = make_plan(PlanInput(params=p, strategy="nvme-all", grad_accum=4)).per_optimizer_step
    assert one.read["parameters"] == 4 * p and four.read["parameters"] == 16 * p
    assert one.write["parameters"] == four.write["parameters"] == 2 * p
