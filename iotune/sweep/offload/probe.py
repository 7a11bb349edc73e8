"""The job as the offload search first sees it: one start of it stopped at
deepspeed.initialize, where its startup hook reports its parameter
tensors, the dtype ZeRO-3 partitions them in and its process's memory,
before DeepSpeed allocates anything. The start is journaled, so a resumed
search does not start the job again (the start builds the user's model
before it gets there)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ...errors import IotuneError, UsageError
from ...host.ledger import temp_dir
from ...model.offload import JobShape, OffloadKnobs
from ...model.offload_result import JobProbe
from ...workloads.presets import PRESETS, tensor_numels
from ..executor import Target
from ..journal import Journal
from .changes import apply_changes
from .runner import BuiltinRunner

if TYPE_CHECKING:
    from .search import OffloadSearch


def partitioned_in(knobs: OffloadKnobs, dtype: str) -> OffloadKnobs:
    """`knobs` with the dtype ZeRO-3 partitions the parameters in (reported
    by the job's hook; DeepSpeed may convert an fp32 model to bf16), the
    gradient-accumulation dtype staying the config's."""
    if not dtype or dtype == knobs.dtype:
        return knobs
    return replace(knobs, dtype=dtype, grad_accum_dtype=knobs.grad_accum_dtype or knobs.dtype)


def job_shape(search: OffloadSearch, target: Target, journal: Journal, say: Callable[[str], None]) -> JobProbe:
    """The job's parameter tensors, the dtype they are partitioned in ("":
    the config's) and its process's memory at deepspeed.initialize (None:
    not measured), from one start of the job stopped at deepspeed.initialize,
    where its hook reports them, before DeepSpeed allocates anything; or, on
    resume, from the journal's record of that start. The built-in model's
    tensors are known (built under deepspeed.zero.Init, in the config's
    dtype): its start measures the memory only."""
    runner = search.runner
    preset = runner.size if isinstance(runner, BuiltinRunner) else None
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"unknown --model '{preset}': choose one of {', '.join(PRESETS)}")
    known = journal.find_probe(runner.what)
    if known is not None:
        say(f"offload: {runner.what} up to deepspeed.initialize: from the journal (the start that showed it "
            f"is not run again)")
        return known
    say(f"offload: starting {runner.what} up to deepspeed.initialize, to see its "
        + ("memory there" if preset else "tensors and its memory there"))
    with contextlib.ExitStack() as stack:
        work = temp_dir(stack, ".iotune-offload-", target.files_dir)
        (work / "swap").mkdir()
        tensors, error = runner.probe(apply_changes(search.base_cfg, {}, str(work / "swap")), work, target.cgroup,
                                      search.plan.timeout_s)
    if preset is not None:
        probe = JobProbe(runner.what, JobShape(tuple(tensor_numels(PRESETS[preset]))), "",
                         tensors.startup if tensors is not None else None)
    elif tensors is None:
        raise IotuneError(f"your command reported no DeepSpeed model ({error}): iotune sees the model's tensors "
                          f"through its startup hook on PYTHONPATH, at deepspeed.initialize, so the command must "
                          f"train with DeepSpeed in Python")
    else:
        probe = JobProbe(runner.what, JobShape(tensors.numels, max(1, tensors.world)), tensors.partition_dtype,
                         tensors.startup)
    if probe.startup is not None:           # a start that measured nothing is tried again on resume
        journal.record_probe(probe)
    return probe
