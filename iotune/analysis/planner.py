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

NVMe traffic per optimizer step (derived from ZeRO-Infinity's swapper, which
the attribution of real traces confirms: every optimizer tensor is read in
and written back once per step, and the fp32 gradients of swappable tensors
are swapped out and back in):

    optimizer state   read 12 B x P_opt     write 12 B x P_opt
    gradients         read  4 B x P_swap    write  4 B x P_swap
    parameters        read  2 x w x A x P_swap  write  w x P_swap  (nvme-all only; w = 2 B in bf16:
                      fetched for forward and again for backward in each of the A = grad_accum
                      micro-steps, written once after the update)

P_opt = params / gpus. P_swap counts only parameters in tensors DeepSpeed
swaps — at least max(1 MiB, aio.block_size) in their swap dtype — divided
by gpus; for billion-parameter models that is essentially all of them. Each
swapped tensor is padded to 1 KiB (O_DIRECT alignment): under 1 KiB per
tensor, ignored here. Parameter traffic is an upper bound: a model whose
swappable parameters fit the swap buffers is fetched once and stays resident.

Storage time per step = (read + write) / (drives x drive bandwidth), with
drives striped (RAID0): the bytes of one step must cross the drives'
combined bandwidth, and the optimizer step cannot finish before they have.
"""

from __future__ import annotations

import math

from ..model import units
from ..model.attribution import GRADIENTS, OPTIMIZER_CATEGORIES, PARAMETERS
from ..model.plan import Plan, PlanInput, Traffic

WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def traffic(inp: PlanInput) -> Traffic:
    """NVMe bytes per optimizer step, per rank."""
    if inp.strategy not in ("nvme-opt", "nvme-all"):
        return Traffic()
    p_opt = inp.params / inp.gpus
    p_swap = (inp.swappable_params if inp.swappable_params is not None else inp.params) / inp.gpus
    w = WEIGHT_BYTES[inp.precision]
    read = {**{cat: 4 * p_opt for cat in OPTIMIZER_CATEGORIES}, GRADIENTS: 4 * p_swap}
    write = dict(read)
    if inp.strategy == "nvme-all":
        read[PARAMETERS] = 2 * w * p_swap * inp.grad_accum
        write[PARAMETERS] = w * p_swap
    return Traffic(read, write)


def memory(inp: PlanInput) -> dict[str, dict[str, float]]:
    """Bytes per rank in each tier, by component."""
    p, g = inp.params, inp.gpus
    w = WEIGHT_BYTES[inp.precision]
    s = inp.strategy
    if s == "baseline":
        return {"GPU": {"weights": w * p, "gradients": 4 * p / g, "Adam moments": 8 * p / g,
                        "master weights": 4 * p / g}, "CPU": {}, "NVMe": {}}
    gpu = {"weights": w * p if s != "nvme-all" else 0.0, "gradients (training dtype)": w * p}
    cpu = {"gradients (fp32)": 4 * p / g, "pinned swap buffers": float(inp.pinned_buffer_bytes)}
    nvme: dict[str, float] = {}
    if s in ("cpu", "zenflow"):
        cpu.update({"master weights": 4 * p / g, "Adam moments": 8 * p / g})
    else:
        p_swap = inp.swappable_params if inp.swappable_params is not None else p
        nvme.update({"master weights": 4 * p / g, "Adam moments": 8 * p / g, "gradients (fp32)": 4 * p_swap / g})
    if s == "nvme-all":
        nvme["weights"] = w * p / g
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
    return Plan(inp, mem, sum(mem["NVMe"].values()), opt, per_train, storage_s, need_bw, drives,
                bottleneck(inp, moved, storage_s))


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
