"""The memory DeepSpeed 0.19.8 locks (mlock) for NVMe swapping, counted as
its swappers allocate it, whatever `pin_memory` says (pin_memory is about
CPU offload tensors; swap buffers always come from new_cpu_locked_tensor):

- parameter swap buffers (partitioned_param_swapper.py): one tensor of
  buffer_count x aligned(buffer_size) elements in the model dtype
  (2 B for fp16/bf16, 4 B for fp32);
- optimizer swap buffers (optimizer_utils.py, SwapBufferManager): buffer_count
  tensors of aligned(largest sub-group) elements in the master dtype (4 B,
  2 B with bf16/fp16 master weights). A sub-group collects parameters until
  it reaches sub_group_size, so the largest is min(sub_group_size (+ one
  parameter), the rank's partition: params / gpus);
- the parameter swap-out buffer (stage3.py, reserve_partitioned_swap_space):
  when a rank's parameters exceed offload_param.max_in_cpu (1e9), one buffer
  of the largest sub-group's full (unpartitioned) size in the model dtype;
  counted only when the model size is known;

aligned(n) rounds up to 1024 B x intra_op_parallelism, and each allocation
locks whole pages. Defaults: param buffer_count 5, buffer_size 1e8;
optimizer buffer_count 4; sub_group_size 1e9. With aio.use_gds the
parameter buffers live on the GPU and are not counted.

The numbers are iotune.model.offload's (one model for lint, doctor, plan and
the sweep, checked against DeepSpeed runs); this module adds what a config
alone leaves open (an unknown model size, "auto") as assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...model import units
from ...model.lint import LintEnv, LintFinding
from ...model.offload import JobShape, OffloadKnobs, aligned, pages, sub_groups
from .view import (OPTIMIZER_DEFAULTS, PARAM_DEFAULTS, SUB_GROUP_SIZE_DEFAULT, aio_block, device,
                   element_bytes, finding, model_dtype, offload, setting, stage, zero)

@dataclass(frozen=True)
class Locked:
    """One set of swap buffers: count x elements x element size."""

    label: str
    count: int
    elements: int
    element_bytes: int
    assumption: str = ""           # empty: counted from known values
    separate: bool = True          # count allocations of elements each (else one of count x elements)

    @property
    def bytes(self) -> int:
        one = self.elements * self.element_bytes
        return self.count * pages(one) if self.separate else pages(self.count * one)

    def describe(self) -> str:
        text = (f"{self.label} {self.count} x {self.elements:,} x {self.element_bytes} B = "
                f"{'up to ' if 'unknown' in self.assumption else ''}{units.mib(self.bytes)}")
        return text + (f" [{self.assumption}]" if self.assumption else "")


def _aligned(elements: int, elem_bytes: int, cfg: dict[str, Any]) -> int:
    return aligned(elements, elem_bytes, OffloadKnobs.from_ds_config(cfg))


def _swaps_at_stage3(cfg: dict[str, Any], which: str) -> bool:
    return device(cfg, which) == "nvme" and stage(cfg).value in (3, None)


def param_buffers(cfg: dict[str, Any]) -> Locked | None:
    if not _swaps_at_stage3(cfg, "offload_param"):
        return None
    if aio_block(cfg).get("use_gds") is True:
        return None
    where = "zero_optimization.offload_param"
    p = offload(cfg, "offload_param")
    count = setting(p, "buffer_count", PARAM_DEFAULTS["buffer_count"], where)
    size = setting(p, "buffer_size", PARAM_DEFAULTS["buffer_size"], where)
    dtype = model_dtype(cfg)
    elem = element_bytes(dtype.value)
    notes = [k.why for k in (count, size) if not k.known]
    if not dtype.known:
        notes.append(f"{dtype.why}; assumed 2 B elements")
    label = f"parameters ({dtype.value or 'fp16/bf16'})"
    return Locked(label, count.value, _aligned(size.value, elem, cfg), elem, "; ".join(notes), separate=False)


def optimizer_buffers(cfg: dict[str, Any], env: LintEnv) -> Locked | None:
    if not _swaps_at_stage3(cfg, "offload_optimizer"):
        return None
    where = "zero_optimization.offload_optimizer"
    count = setting(offload(cfg, "offload_optimizer"), "buffer_count", OPTIMIZER_DEFAULTS["buffer_count"], where)
    sub = setting(zero(cfg), "sub_group_size", SUB_GROUP_SIZE_DEFAULT, "zero_optimization")
    elem = 2 if _master_16bit(cfg) else 4
    notes = [k.why for k in (count, sub) if not k.known]
    if env.params:
        partition = math.ceil(env.params / max(env.gpus, 1))
        if env.largest_param_numel:          # a group closes past sub_group_size: by up to one tensor
            shape = JobShape.approximate(env.params, env.largest_param_numel, max(env.gpus, 1))
            knobs = replace(OffloadKnobs.from_ds_config(cfg), sub_group_size=sub.value)
            largest = min(max(sub_groups(knobs, shape)), partition)      # never more than the rank holds
        else:
            largest = min(sub.value, partition)
    else:
        largest = sub.value
        notes.append(f"model size unknown: counted a full sub-group of {sub.value:,} (give --params or --model)")
    return Locked("optimizer (fp32 master)" if elem == 4 else "optimizer (16-bit master)", count.value,
                  _aligned(largest, elem, cfg), elem, "; ".join(notes))


def param_reuse_buffer(cfg: dict[str, Any], env: LintEnv) -> Locked | None:
    if not _swaps_at_stage3(cfg, "offload_param") or not env.params:
        return None
    gpus = max(env.gpus, 1)
    max_in_cpu = setting(offload(cfg, "offload_param"), "max_in_cpu", PARAM_DEFAULTS["max_in_cpu"],
                         "zero_optimization.offload_param")
    partition = math.ceil(env.params / gpus)
    if partition <= max_in_cpu.value:
        return None
    sub = setting(zero(cfg), "sub_group_size", SUB_GROUP_SIZE_DEFAULT, "zero_optimization")
    largest = min(partition, sub.value + (env.largest_param_numel or 0) // gpus) * gpus
    dtype = model_dtype(cfg)
    elem = element_bytes(dtype.value)
    notes = [k.why for k in (max_in_cpu, sub) if not k.known] + ([] if dtype.known else [f"{dtype.why}; assumed 2 B"])
    return Locked("parameter swap-out", 1, _aligned(min(largest, env.params), elem, cfg), elem, "; ".join(notes))


def _master_16bit(cfg: dict[str, Any]) -> bool:
    bf16, fp16 = cfg.get("bf16"), cfg.get("fp16")
    return (isinstance(bf16, dict) and bf16.get("bf16_master_weights_and_grads") is True) or \
        (isinstance(fp16, dict) and fp16.get("fp16_master_weights_and_grads") is True)


def locked_buffers(cfg: dict[str, Any], env: LintEnv) -> list[Locked]:
    found = (param_buffers(cfg), param_reuse_buffer(cfg, env), optimizer_buffers(cfg, env))
    return [b for b in found if b is not None]


def pinned_bytes(cfg: dict[str, Any], env: LintEnv | None = None) -> int:
    """Bytes DeepSpeed locks for NVMe swap buffers under `cfg` (per rank)."""
    return sum(b.bytes for b in locked_buffers(cfg, env or LintEnv()))


def memory_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    buffers = locked_buffers(cfg, env)
    need = sum(b.bytes for b in buffers)
    if need == 0:
        return []
    exact = all(not b.assumption for b in buffers)
    where = "zero_optimization.offload_param" if buffers[0].label.startswith("param") else \
        "zero_optimization.offload_optimizer"
    detail = "; ".join(b.describe() for b in buffers)
    head = f"swap buffers lock {units.mib(need)} per rank ({detail})"
    out = []
    if env.memlock_bytes is not None and not env.can_lock_unlimited and need > env.memlock_bytes:
        out.append(finding("pinned-memlock", "error" if exact else "warning", where,
                           f"{head}, over ulimit -l ({units.mib(env.memlock_bytes)}): mlock fails",
                           "raise `ulimit -l` (memlock) for the training user, or lower buffer_count / "
                           "buffer_size / sub_group_size (pin_memory does not change swap buffers)"))
    if env.ram_bytes and need > 0.5 * env.ram_bytes:
        sev = "error" if exact and need > env.ram_bytes else "warning"
        out.append(finding("pinned-ram", sev, where, f"{head}, of {units.mib(env.ram_bytes)} RAM",
                           "lower buffer_count, buffer_size (e.g. 1e7) or sub_group_size"))
    return out
