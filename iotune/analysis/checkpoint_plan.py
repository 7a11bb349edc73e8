"""The checkpoint rows of `iotune plan`: what one DeepSpeed checkpoint of
the planned job holds (iotune.model.checkpoint's per-part model), how long
saving and loading it take at the drives' bandwidth, the space `--keep N`
retained checkpoints need beside the swap files, and with
`--checkpoint-every STEPS` what checkpoints add to each step's time and
writes (the SSD-wear forecast counts them).

Save time assumes the checkpoint directory is on the same drives as the swap
files, DeepSpeed's copy of the offloaded tensors reading them there:

    save seconds = (bytes written + offloaded bytes read) / (drives x drive bandwidth)
    load seconds = the same bytes the other way (the copy back into the swap folder)

Both are per rank, at rank 0 (it also writes `latest` and the recovery
scripts; below ZeRO-3 it alone writes the model states).
"""

from __future__ import annotations

from ..errors import UsageError
from ..model import units
from ..model.checkpoint import checkpoint_bytes, keep_that_fits, transfer_seconds
from ..model.checkpoint_io import OFFLOADED
from ..model.offload import JobShape, OffloadKnobs
from ..model.plan import CheckpointPlan, Plan, PlanInput


def plan_knobs(inp: PlanInput, block_size: int = 1 << 20) -> OffloadKnobs:
    """The offload knobs of the plan: its config's (--ds-config), else the
    strategy's with DeepSpeed's defaults."""
    if inp.knobs is not None:
        return inp.knobs
    stage = {"baseline": 1, "cpu": 2, "zenflow": 2}.get(inp.strategy, 3)
    device = "nvme" if inp.strategy in ("nvme-opt", "nvme-all") else "cpu" if stage == 2 else "none"
    return OffloadKnobs(stage=stage, optimizer_device=device,
                        param_device="nvme" if inp.strategy == "nvme-all" else "none", block_size=block_size,
                        dtype=inp.precision)


def checkpoint_plan(plan: Plan, shape: JobShape, keep: int = 1, every_steps: int | None = None,
                    block_size: int = 1 << 20) -> CheckpointPlan:
    inp = plan.inp
    b = checkpoint_bytes(plan_knobs(inp, block_size), shape)
    parts = {p: float(b.part(p)) for p in (*b.per_rank, *b.rank0_only)}
    rank = float(b.rank_bytes(0))
    read = float(b.per_rank.get(OFFLOADED, 0))
    save_s = transfer_seconds(rank + read, inp.drive_bytes_per_s, inp.drives)
    per_step = save_s / every_steps if every_steps and save_s is not None else None
    return CheckpointPlan(parts, rank, float(b.total_bytes), read, rank, save_s, save_s, keep, keep * rank,
                          plan.nvme_capacity_bytes, plan.nvme_capacity_bytes + keep * rank, every_steps, per_step,
                          rank / every_steps if every_steps else None, dict(b.formulas))


def check_space(cp: CheckpointPlan, drive_capacity_bytes: float | None, drives: int) -> None:
    """UsageError when `keep` checkpoints and the swap files do not fit on
    the rank's drives, with the numbers and the keep that fits."""
    if not drive_capacity_bytes:
        return
    room = drive_capacity_bytes * max(1, drives)
    if cp.space_bytes <= room:
        return
    fits = keep_that_fits(room, cp.swap_bytes, cp.rank_bytes)
    raise UsageError(f"--keep {cp.keep}: {cp.keep} checkpoint(s) of {units.volume(cp.rank_bytes)} (rank 0) beside "
                     f"{units.volume(cp.swap_bytes)} of swap files need {units.volume(cp.space_bytes)} per rank, "
                     f"more than its {drives} drive(s) of {units.volume(drive_capacity_bytes)} hold "
                     f"({units.volume(room)}): "
                     + (f"keep at most {fits}" if fits else "not even one fits: use larger drives or more of them")
                     + ", or give the checkpoints another directory (and drop --keep here)")
