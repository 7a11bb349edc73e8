"""The whole-offload search space (iotune/sweep/offload/space.py): pinned
dimensions stay fixed, dimensions that cannot matter are left out with the
reason, and candidates that break DeepSpeed's bounds or the host's memory
are refused with the numbers before anything runs."""

from __future__ import annotations

import pytest

from iotune.errors import UsageError
from iotune.model.offload import JobShape, OffloadKnobs, violations
from iotune.model.host_memory import FIT_MARGIN, host_memory
from iotune.sweep.offload.space import Budget, candidates, dimensions, parse_fixes
from iotune.workloads.presets import PRESETS, tensor_numels

SHAPE = JobShape(tuple(tensor_numels(PRESETS["small"])))
NVME = OffloadKnobs(optimizer_device="nvme")


def test_fixes_are_typed_and_an_unknown_key_names_the_nearest() -> None:
    assert parse_fixes(["zero_optimization.sub_group_size=1e8", "zero_optimization.offload_param.device=nvme",
                        "zero_optimization.offload_optimizer.pipeline_read=true"]) == {
        "zero_optimization.sub_group_size": 100_000_000, "zero_optimization.offload_param.device": "nvme",
        "zero_optimization.offload_optimizer.pipeline_read": True}
    with pytest.raises(UsageError, match=r"^--fix zero_optimization.sub_grup_size: not an offload key iotune searches; "
                                         r"did you mean zero_optimization.sub_group_size\? the keys are: "):
        parse_fixes(["zero_optimization.sub_grup_size=1e8"])
    for bad, says in (("aio.block_size=-4096", "expected a whole number >= 0"),
                      ("zero_optimization.offload_optimizer.pipeline_read=yes", "expected true or false"),
                      ("zero_optimization.offload_param.device=disk", "choose one of none, cpu, nvme"),
                      ("aio.block_size", "give KEY=VALUE")):
        with pytest.raises(UsageError, match=says):
            parse_fixes([bad])


def test_a_config_without_zero3_searches_nothing_and_says_why() -> None:
    search, skipped = dimensions(OffloadKnobs(stage=2, optimizer_device="cpu"), SHAPE)
    assert search == [] and len(skipped) == 6
    assert {d.why_not for d in skipped} == {"ZeRO stage 2: DeepSpeed turns `device: nvme` into CPU offload there; "
                                           "these knobs exist in stage 3 only"}


def test_pinned_and_pointless_dimensions_are_left_out() -> None:
    fixes = parse_fixes(["zero_optimization.offload_param.device=none", "zero_optimization.sub_group_size=1e9"])
    search, skipped = dimensions(NVME, SHAPE, fixes)
    why = {d.key: d.why_not for d in skipped}
    assert why["zero_optimization.offload_param.device"] == "fixed by --fix"
    assert why["zero_optimization.offload_param.buffer_count"] == ("parameters are fixed at none: parameter buffers "
                                                                   "apply to NVMe only")
    assert why["zero_optimization.offload_optimizer.pipeline_read"].startswith("one optimizer sub-group per rank")
    assert [d.key for d in search] == ["zero_optimization.offload_optimizer.device"]


def test_candidates_get_the_buffers_their_pipelining_needs_and_never_break_a_bound() -> None:
    search, _ = dimensions(NVME, SHAPE, {})
    fit, refused = candidates(NVME, SHAPE, search, {})
    assert refused == [] and fit
    assert all(violations(k, SHAPE) == [] for k in fit)
    piped = [k for k in fit if k.pipeline_read and k.pipeline_write]
    assert piped and all(k.optimizer_buffer_count == 12 for k in piped)
    assert all(not k.pipelined for k in fit if k.optimizer_device == "cpu")   # one candidate per behaviour
    # the user's own buffer count is kept, and what it breaks is said with DeepSpeed's words
    fixes = parse_fixes(["zero_optimization.offload_optimizer.buffer_count=4", "zero_optimization.sub_group_size=1e6",
                         "zero_optimization.offload_optimizer.device=nvme"])
    fit, refused = candidates(NVME, SHAPE, dimensions(NVME, SHAPE, fixes)[0], fixes)
    assert {(k.pipeline_read, k.pipeline_write) for k in fit} == {(False, False)}
    assert len(refused) == 3 * 4          # 3 pipelined modes x (parameters none, cpu, nvme with 5 or 10 buffers)
    assert all("buffer_count: at least" in r.reasons[0] for r in refused)


def test_a_candidate_over_the_memory_budget_is_refused_with_the_numbers() -> None:
    cpu = OffloadKnobs(optimizer_device="cpu")
    memory = host_memory(cpu, SHAPE)
    need = memory.peak_bytes
    assert [i.nbytes for i in memory.items if i.label == "optimizer state in RAM"] == [16 * SHAPE.params_per_rank]
    fit, refused = candidates(cpu, SHAPE, [], {}, Budget(host_bytes=need - 1, source="MemAvailable"))
    [reason] = refused[0].reasons
    assert fit == [] and reason.startswith(f"needs {need / 2**20:.1f} MiB of host memory at its peak (")
    assert f"optimizer state in RAM {16 * SHAPE.params_per_rank / 2**20:.1f} MiB" in reason
    assert reason.endswith(f"over {(need - 1) / 2**20:.1f} MiB (MemAvailable) with a {FIT_MARGIN * 100:.3g} % margin")
    locked = host_memory(NVME, SHAPE).locked_bytes
    _, refused = candidates(NVME, SHAPE, [], {}, Budget(memlock_bytes=locked - 1))
    assert refused[0].reasons == (f"locks {locked / 2**20:.1f} MiB of swap buffers, over ulimit -l "
                                  f"{(locked - 1) / 2**20:.1f} MiB",)