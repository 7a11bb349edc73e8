"""A config's host memory, as lint reads it: iotune.model.host_memory (the
one model `plan`, `doctor --ds-config` and `sweep offload` use) applied
to what the config and the command line say of the model, with what they
leave open said as assumptions:

- the model's size: its tensors (--model), or a parameter count (--params,
  with the largest tensor where known), or nothing (then one full
  sub-group, sub_group_size elements, is counted: the most DeepSpeed locks
  for the optimizer whatever the model);
- "auto" values (Hugging Face fills them in): DeepSpeed's defaults;
- aio.use_gds: the parameter swap buffers live on the GPU (the model's
  accelerator memory), not counted on CUDA.

Two rules: the locked part against ulimit -l (swap buffers are mlock'd
whatever pin_memory says, since DeepSpeed 0.19.4), and the peak against
the host's RAM (iotune.model.host_memory.host_fit: over, or tight).
"""

from __future__ import annotations

from typing import Any

from ...model import units
from ...model.host_memory import HostContext, HostMemory, MemoryItem, host_fit, host_memory
from ...model.lint import LintEnv, LintFinding
from ...model.offload import ASSUMED_LARGEST, JobShape, OffloadKnobs
from .view import AUTO, finding, offload, zero

LOCKED_WHERE = {"parameter swap buffers": "zero_optimization.offload_param",
                "parameter swap-out buffer": "zero_optimization.offload_param"}


def assumptions(cfg: dict[str, Any], env: LintEnv) -> tuple[JobShape, list[str]]:
    """The model as far as it is known, and what was assumed."""
    ranks = max(env.gpus, 1)
    notes = [f"{where}.{key} is \"auto\": DeepSpeed's default counted"
             for where, block in (("zero_optimization", zero(cfg)),
                                  ("zero_optimization.offload_optimizer", offload(cfg, "offload_optimizer")),
                                  ("zero_optimization.offload_param", offload(cfg, "offload_param")))
             for key in ("sub_group_size", "buffer_count", "buffer_size", "max_in_cpu") if block.get(key) == AUTO]
    if env.numels:
        return JobShape(env.numels, ranks), notes
    if env.params:
        sub = OffloadKnobs.from_ds_config(cfg).sub_group_size
        largest = env.largest_param_numel or min(env.params, sub * ranks, ASSUMED_LARGEST)
        if not env.largest_param_numel:
            notes.append(f"tensor sizes unknown: tensors of up to {largest:,} elements assumed (give --model)")
        return JobShape.approximate(env.params, largest, ranks), notes
    sub = OffloadKnobs.from_ds_config(cfg).sub_group_size
    notes.append(f"model size unknown: counted a full sub-group of {sub:,} (give --params or --model)")
    return JobShape((sub * ranks,), ranks), notes


def job_memory(cfg: dict[str, Any], env: LintEnv) -> tuple[HostMemory, list[str]]:
    """(one rank's host memory under `cfg`, the assumptions it rests on)."""
    shape, notes = assumptions(cfg, env)
    knobs = OffloadKnobs.from_ds_config(cfg)
    memory = host_memory(knobs, shape, HostContext(env.accelerator or "cuda", env.baseline_bytes,
                                                    env.activation_bytes, activation_note=env.activation_note))
    return memory, notes


def locked_buffers(cfg: dict[str, Any], env: LintEnv | None = None) -> list[MemoryItem]:
    """The mlock'd items of `cfg`'s host memory (per rank)."""
    memory, _ = job_memory(cfg, env or LintEnv())
    return [i for i in memory.items if i.locked]


def pinned_bytes(cfg: dict[str, Any], env: LintEnv | None = None) -> int:
    """Bytes DeepSpeed locks for NVMe swap buffers under `cfg` (per rank)."""
    return sum(i.nbytes for i in locked_buffers(cfg, env))


def describe(items: list[MemoryItem]) -> str:
    return "; ".join(f"{i.label} {units.mib(i.nbytes)} ({i.formula})" for i in items)


def memory_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    memory, notes = job_memory(cfg, env)
    locked = [i for i in memory.items if i.locked]
    need = sum(i.nbytes for i in locked)
    if need == 0:
        return []
    exact = not notes
    assumed = f" [{'; '.join(notes)}]" if notes else ""
    where = next((LOCKED_WHERE[i.label] for i in locked if i.label in LOCKED_WHERE),
                 "zero_optimization.offload_optimizer")
    head = f"swap buffers lock {units.mib(need)} per rank ({describe(locked)}){assumed}"
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
    if env.ram_bytes and (env.params or env.numels):
        out += host_memory_rule(memory, env.ram_bytes, exact, assumed)
    return out


def host_memory_rule(memory: HostMemory, ram_bytes: int, exact: bool, assumed: str) -> list[LintFinding]:
    """One rank's peak against the RAM, by host_fit's verdict: over is an
    error (a warning where the model's size was assumed), tight a warning."""
    fit = host_fit(memory.peak_bytes, ram_bytes, budget_label=" of RAM")
    if fit.verdict == "fits":
        return []
    peak = (f"one rank peaks at {units.mib(memory.peak_bytes)} of host memory ({memory.peak_phase()}: "
            f"{describe([i for i in memory.items if i.phase in ('resident', memory.peak_phase())])}){assumed}")
    severity = "error" if fit.verdict == "over" and exact else "warning"
    killed = ": the kernel's OOM killer ends it" if fit.verdict == "over" else ""
    return [finding("host-memory", severity, "zero_optimization", f"{peak}, {fit.clause}{killed}",
                    "lower sub_group_size (the optimizer's swap buffers and step-1 moments scale with the largest "
                    "sub-group) or the buffer counts, or offload less to the CPU; `iotune sweep offload` searches "
                    "what fits")]
