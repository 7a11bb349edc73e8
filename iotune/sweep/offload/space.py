"""The whole-offload search space beyond `aio`, for ZeRO-3: where state
lives, how the optimizer state is cut, pipelining and the buffers each
needs, parameter buffers. What the user pins stays fixed (`--fix KEY=VALUE`
in DeepSpeed's dotted key names); a dimension that cannot matter for the
job is left out with the reason; a candidate that breaks one of
DeepSpeed's bounds or does not fit the host's memory is refused with the
numbers, never run (iotune.model.offload decides both).

    dims, skipped = dimensions(base, shape)
    fit, refused = candidates(base, shape, dims, fixes, budget)
"""

from __future__ import annotations

import difflib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import UsageError
from ...model import units
from ...model.host_memory import FIT_MARGIN, HostContext, HostFit, HostMemory, host_fit, host_memory
from ...model.offload import JobShape, OffloadKnobs, sub_groups, violations
from ...model.offload_result import Dimension, Refused

# DeepSpeed's dotted key -> the knob it sets, its type and the values searched
# (an empty tuple: only fixable, not searched).
KEYS: dict[str, tuple[str, type, tuple[Any, ...]]] = {
    "zero_optimization.offload_optimizer.device": ("optimizer_device", str, ("cpu", "nvme")),
    "zero_optimization.offload_param.device": ("param_device", str, ("none", "cpu", "nvme")),
    "zero_optimization.sub_group_size": ("sub_group_size", int, (100_000_000, 250_000_000, 500_000_000,
                                                                 1_000_000_000)),
    "zero_optimization.offload_optimizer.pipeline_read": ("pipeline_read", bool, (False, True)),
    "zero_optimization.offload_optimizer.pipeline_write": ("pipeline_write", bool, (False, True)),
    "zero_optimization.offload_optimizer.buffer_count": ("optimizer_buffer_count", int, ()),
    "zero_optimization.offload_param.buffer_count": ("param_buffer_count", int, (5, 10)),
    "zero_optimization.offload_param.buffer_size": ("param_buffer_size", int, ()),
    "zero_optimization.offload_param.max_in_cpu": ("max_in_cpu", int, ()),
    "aio.block_size": ("block_size", int, ()),
    "aio.intra_op_parallelism": ("intra_op_parallelism", int, ()),
}
PIPELINE = ("zero_optimization.offload_optimizer.pipeline_read", "zero_optimization.offload_optimizer.pipeline_write")


def parse_fixes(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`KEY=VALUE` pairs in DeepSpeed's dotted names, typed (VALUE as JSON:
    1e8, true, "nvme"); an unknown key or a value of the wrong type is a
    UsageError naming the keys that exist."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not text.strip():
            raise UsageError(f"--fix {item!r}: give KEY=VALUE, e.g. zero_optimization.sub_group_size=1e8")
        if key not in KEYS:
            near = difflib.get_close_matches(key, list(KEYS), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise UsageError(f"--fix {key}: not an offload key iotune searches; {hint}the keys are: "
                             + ", ".join(KEYS))
        out[key] = _typed(key, text.strip())
    return out


def _typed(key: str, text: str) -> Any:
    want = KEYS[key][1]
    try:
        value = json.loads(text)
    except ValueError:
        value = text                                   # a bare word: nvme, cpu, none
    if want is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if want is bool and not isinstance(value, bool) or want is int and (isinstance(value, bool) or
                                                                          not isinstance(value, int) or value < 0):
        raise UsageError(f"--fix {key}={text}: expected {'true or false' if want is bool else 'a whole number >= 0'}")
    if want is str and value not in KEYS[key][2]:
        raise UsageError(f"--fix {key}={text}: choose one of {', '.join(KEYS[key][2])}")
    return value


def dimensions(base: OffloadKnobs, shape: JobShape,
               fixes: dict[str, Any] | None = None) -> tuple[list[Dimension], list[Dimension]]:
    """(the dimensions to search, those left out with why) for a job whose
    config is `base`: pinned ones stay fixed, and one that cannot matter
    for this job is not run."""
    fixes = fixes or {}
    base = replace(base, **{KEYS[k][0]: v for k, v in fixes.items()})
    search: list[Dimension] = []
    skipped: list[Dimension] = []
    for key, (_, _, values) in KEYS.items():
        if not values:
            continue
        if key == "zero_optimization.sub_group_size":
            values = sub_group_grid(shape)
        why = "fixed by --fix" if key in fixes else _why_not(key, base, shape, fixes)
        (skipped if why else search).append(Dimension(key, values, why))
    return search, skipped


def sub_group_grid(shape: JobShape) -> tuple[int, ...]:
    """sub_group_size values worth trying: DeepSpeed's log grid (1e8 to its
    default 1e9) where the rank holds more than one such group; for a
    smaller model, 1/8, 1/4, 1/2 and all of the rank's parameters (a grid
    value past them is the same single sub-group)."""
    p = shape.params_per_rank
    grid = [v for v in KEYS["zero_optimization.sub_group_size"][2] if v < p]
    if len(grid) < 2:
        grid = [max(1, p // d) for d in (8, 4, 2)]
    return tuple(sorted(set(grid))) + (OffloadKnobs().sub_group_size,)


def _why_not(key: str, base: OffloadKnobs, shape: JobShape, fixes: dict[str, Any]) -> str:
    if base.stage != 3:
        return (f"ZeRO stage {base.stage}: DeepSpeed turns `device: nvme` into CPU offload there; "
                "these knobs exist in stage 3 only")
    opt_device = fixes.get("zero_optimization.offload_optimizer.device")
    param_device = fixes.get("zero_optimization.offload_param.device")
    if key in PIPELINE:
        if opt_device == "cpu":
            return "the optimizer is fixed on the CPU: nothing is swapped to pipeline"
        groups = sub_groups(base, shape)
        if len(groups) < 2 and "zero_optimization.sub_group_size" in fixes:
            return "one optimizer sub-group per rank: pipelining overlaps one sub-group's swap with another's Adam"
    if key.startswith("zero_optimization.offload_param.") and key != "zero_optimization.offload_param.device":
        if param_device in ("none", "cpu"):
            return f"parameters are fixed at {param_device}: parameter buffers apply to NVMe only"
    return ""


@dataclass(frozen=True)
class Budget:
    """What the host allows one rank: its memory at the peak
    (iotune.model.host_memory), and ulimit -l (None: no limit); `available`
    reads MemAvailable again before each trial (None: not re-read)."""

    host_bytes: int | None = None
    memlock_bytes: int | None = None
    source: str = ""            # where host_bytes comes from, for messages ("MemAvailable", "--max-host-memory")
    available: Callable[[], int | None] | None = field(default=None, compare=False)
    margin: float = FIT_MARGIN  # a peak is admitted when peak x (1 + margin) fits (host_fit)


def candidates(base: OffloadKnobs, shape: JobShape, dims: list[Dimension], fixes: dict[str, Any] | None = None,
               budget: Budget = Budget(), context: HostContext = HostContext()) -> tuple[list[OffloadKnobs],
                                                                                          list[Refused]]:
    """Every combination of `dims` over `base` with `fixes` applied (the
    optimizer's buffer_count raised to what its pipelining needs), split
    into those that can run and those refused with the numbers."""
    fixed = replace(base, **{KEYS[k][0]: v for k, v in (fixes or {}).items()})
    fit: list[OffloadKnobs] = []
    refused: list[Refused] = []
    seen: set[OffloadKnobs] = set()
    for combo in itertools.product(*(d.values for d in dims)):
        knobs = replace(fixed, **{KEYS[d.key][0]: v for d, v in zip(dims, combo)})
        knobs = _meaningful(knobs, shape, fixes or {}, fixed)
        if knobs in seen:
            continue
        seen.add(knobs)
        reasons = refusals(knobs, shape, budget, context)
        if reasons:
            refused.append(Refused(knobs, reasons))
        else:
            fit.append(knobs)
    return fit, refused


def _meaningful(knobs: OffloadKnobs, shape: JobShape, fixes: dict[str, Any], base: OffloadKnobs) -> OffloadKnobs:
    """One candidate per distinct behaviour: no pipelining without NVMe or
    with one sub-group, the buffers a pipelining mode needs (unless the user
    fixed them), and a knob that does nothing for the candidate left at the
    job's own value (so it is not a change)."""
    if knobs.optimizer_device != "nvme" and "zero_optimization.sub_group_size" not in fixes:
        knobs = replace(knobs, sub_group_size=base.sub_group_size)        # the swap unit: nothing swapped
    if knobs.optimizer_device != "nvme" or len(sub_groups(knobs, shape)) < 2:
        knobs = replace(knobs, pipeline_read=False, pipeline_write=False)
    if knobs.param_device != "nvme":
        knobs = replace(knobs, param_buffer_count=base.param_buffer_count)
    if "zero_optimization.offload_optimizer.buffer_count" not in fixes and knobs.optimizer_device == "nvme":
        live = 1 + int(knobs.pipeline_read) + int(knobs.pipeline_write)
        knobs = replace(knobs, optimizer_buffer_count=max(4 * live, OffloadKnobs().optimizer_buffer_count))
    return knobs


def host_fit_of(mem: HostMemory, budget: Budget) -> HostFit | None:
    """host_fit's verdict on `mem`'s peak against the budget (None: no budget)."""
    if budget.host_bytes is None:
        return None
    return host_fit(mem.peak_bytes, budget.host_bytes, budget.margin,
                    budget_label=f" ({budget.source})" if budget.source else "")


def refusals(knobs: OffloadKnobs, shape: JobShape, budget: Budget,
             context: HostContext = HostContext()) -> tuple[str, ...]:
    """Why `knobs` cannot run here: DeepSpeed's bounds, then the host's memory."""
    out = [v.describe() for v in violations(knobs, shape)]
    mem = host_memory(knobs, shape, context)
    if budget.memlock_bytes is not None and mem.locked_bytes > budget.memlock_bytes:
        out.append(f"locks {units.mib(mem.locked_bytes)} of swap buffers, over ulimit -l "
                   f"{units.mib(budget.memlock_bytes)}")
    fit = host_fit_of(mem, budget)
    if fit is not None and not fit.admitted:
        items = "; ".join(f"{i.label} {units.mib(i.nbytes)}" for i in mem.items if i.phase in ("resident",
                                                                                            mem.peak_phase()))
        out.append(f"needs {units.mib(mem.peak_bytes)} of host memory at its peak ({mem.peak_phase()}: {items}), "
                   f"{fit.clause}")
    return tuple(out)
