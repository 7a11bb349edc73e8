"""The I/O-volume model behind `iotune plan`.

Per-parameter accounting (mixed precision + Adam, as in Xinnor's published
offload benchmark; the ZeRO paper, arXiv:1910.02054, counts 16 B with
half-precision gradients):

    weights (bf16/fp16)      2 B
    gradients (fp32)         4 B
    Adam moments (fp32)      8 B   (exp_avg 4 B + exp_avg_sq 4 B)
    master weights (fp32)    4 B
    ----------------------------
                            18 B per parameter

What each strategy keeps where (per data-parallel rank; ZeRO partitions the
optimizer state, gradients and, at stage 3, the weights across `gpus`
ranks, so each rank holds 1/gpus of the partitioned parts):

    baseline   GPU: all 18 B
    cpu        GPU: weights 2 B + gradients 2 B (bf16); CPU: master 4 + moments 8 + fp32 gradients 4
    zenflow    as cpu; the top-k fraction of gradient columns is updated on the GPU every step
    nvme-opt   GPU: weights; CPU: fp32 gradients 4 B + swap buffers;
               NVMe: master 4 + moments 8 + fp32 gradient swap files 4
    nvme-all   as nvme-opt, and the 2 B weights also live on NVMe

The gradient swap files are real space: DeepSpeed writes each swappable
gradient partition to its own file under nvme_path
(swap_tensor/optimizer_utils.py OptimizerStateSwapInfo.get_or_create_gradient_paths)
and keeps it for the next step. The 16B table of
Xinnor's published offload benchmark has exactly this
space: 16 B per parameter with the optimizer on NVMe, 18 B with the weights
too (both cases give the same model size, 14.22e9 parameters).

NVMe traffic per optimizer step and NVMe space are iotune.model.offload's,
the one model of DeepSpeed's swapper that `sweep offload` and `lint` use
too (checked against traced runs): every swapped optimizer sub-group's three
states and every gradient partition of at least max(1 MiB, aio block_size)
are read and written once per step, each padded for O_DIRECT; a smaller
tensor stays in RAM. With parameters on NVMe, each swapped parameter is read
for forward and again for backward in each of the grad_accum micro-steps and
written once after the update (an upper bound). Host memory is
iotune.model.host_memory's. Where only a parameter count is known, the model
is cut into tensors of 128 Mi elements (JobShape.from_params).

Storage time per step = (read + write) / (drives x drive bandwidth), with
drives striped (RAID0): the bytes of one step must cross the drives'
combined bandwidth, and the optimizer step cannot finish before they have.
"""

from __future__ import annotations

import math

from ..model import units
from ..model.host_memory import HostContext, HostMemory, host_memory
from ..model.offload import JobShape, OffloadKnobs, nvme_space, step_traffic
from ..model.plan import Plan, PlanInput, Traffic

WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
OFFLOAD = {"nvme-opt": ("nvme", "none"), "nvme-all": ("nvme", "nvme"), "cpu": ("cpu", "none"),
           "zenflow": ("cpu", "none")}


def shape_of(inp: PlanInput) -> JobShape:
    return JobShape(inp.numels, inp.gpus) if inp.numels else JobShape.from_params(inp.params, inp.gpus)


def knobs_of(inp: PlanInput) -> OffloadKnobs:
    """The config the plan is for: the given one, or the strategy's with DeepSpeed's defaults."""
    if inp.knobs is not None:
        return inp.knobs
    opt, param = OFFLOAD.get(inp.strategy, ("none", "none"))
    return OffloadKnobs(stage=3 if inp.strategy.startswith("nvme") else 2, optimizer_device=opt, param_device=param,
                        dtype=inp.precision, block_size=inp.aio_block_size)


def traffic(inp: PlanInput) -> Traffic:
    """NVMe bytes per optimizer step, per rank."""
    if inp.strategy not in ("nvme-opt", "nvme-all"):
        return Traffic()
    read, write = step_traffic(knobs_of(inp), shape_of(inp), inp.grad_accum)
    return Traffic({k: float(v) for k, v in read.items()}, {k: float(v) for k, v in write.items()})


def host(inp: PlanInput) -> HostMemory:
    """One rank's host memory (iotune.model.host_memory) under the plan's config."""
    return host_memory(knobs_of(inp), shape_of(inp), HostContext(inp.accelerator, inp.baseline_bytes,
                                                                 inp.activation_bytes,
                                                                 activation_note=inp.activation_note))


def memory(inp: PlanInput) -> dict[str, dict[str, float]]:
    """Bytes per rank in each tier, by component."""
    p, g = inp.params, inp.gpus
    w = WEIGHT_BYTES[inp.precision]
    s = inp.strategy
    if s == "baseline":
        return {"GPU": {"weights": w * p, "gradients": 4 * p / g, "Adam moments": 8 * p / g,
                        "master weights": 4 * p / g}, "CPU": {}, "NVMe": {}}
    # on DeepSpeed's CPU accelerator the weights and gradients are host memory: the CPU tier's items hold them
    gpu = {"weights": w * p if s != "nvme-all" else 0.0, "gradients (training dtype)": w * p} \
        if inp.accelerator != "cpu" else {}
    mem = host(inp)
    cpu = {i.label: float(i.nbytes) for i in mem.items if i.phase == "resident"}
    cpu["transients at the peak (" + mem.peak_phase() + ")"] = float(mem.peak_bytes - mem.resident_bytes)
    nvme = {k: float(v) for k, v in nvme_space(knobs_of(inp), shape_of(inp)).items()}
    return {"GPU": gpu, "CPU": cpu, "NVMe": nvme}


def make_plan(inp: PlanInput) -> Plan:
    opt = traffic(inp)
    per_train = Traffic({k: v / inp.grad_accum for k, v in opt.read.items()},
                        {k: v / inp.grad_accum for k, v in opt.write.items()})
    moved = opt.total_read + opt.total_write
    bw = inp.drive_bytes_per_s * inp.drives if inp.drive_bytes_per_s else None
    storage_s = striped_seconds(moved, inp.drive_bytes_per_s, inp.drives) if bw else None
    need_bw = moved / inp.target_step_s if inp.target_step_s and moved else None
    drives = math.ceil(need_bw / inp.drive_bytes_per_s) if need_bw and inp.drive_bytes_per_s else None
    mem = memory(inp)
    shape, knobs = shape_of(inp), knobs_of(inp)
    swappable = sum(n for n in shape.numels if 4 * -(-n // shape.ranks) >= knobs.min_swap_bytes)
    return Plan(inp, mem, sum(mem["NVMe"].values()), opt, per_train, storage_s, need_bw, drives,
                bottleneck(inp, moved, storage_s), host(inp), swappable)


def bottleneck(inp: PlanInput, moved: float, storage_s: float | None) -> str:
    s = inp.strategy
    if s == "baseline":
        return "Nothing is offloaded: GPU memory (18 B per parameter) is the limit, not storage."
    if s in ("cpu", "zenflow"):
        extra = (" ZenFlow updates the top-k gradients on the GPU and defers the rest, hiding much of it."
                 if s == "zenflow" else " Gradient accumulation amortises it over micro-steps.")
        return ("No NVMe traffic: the CPU optimizer step (memory-bandwidth bound) and the PCIe copies "
                "of gradients and weights are the cost." + extra)
    if storage_s is None:
        return (f"Each optimizer step moves {units.volume(moved)} to and from NVMe per rank: give "
                f"--drive-bandwidth to see how long that takes.")
    return (f"Each optimizer step moves {units.volume(moved)} to and from NVMe per rank, "
            f"{storage_s:.1f} s at {inp.drives} drive(s): storage bandwidth sets the optimizer step time; "
            f"more drives in RAID0 cut it proportionally, gradient accumulation spreads it over more samples.")


def striped_seconds(moved_bytes: float, drive_bytes_per_s: float | None, drives: int) -> float:
    """Seconds to move `moved_bytes` over `drives` striped drives (RAID0) of
    `drive_bytes_per_s` each: the storage time of one step."""
    if not moved_bytes:
        return 0.0
    return moved_bytes / ((drive_bytes_per_s or 0.0) * max(1, drives)) if drive_bytes_per_s else float("inf")
