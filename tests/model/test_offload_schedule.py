"""A candidate's swap schedule derived from the job's own (iotune/model/
offload_schedule.py), pure: it moves exactly the byte model's bytes each way
whatever the knobs, it is the trace DeepSpeed itself produced when one was
recorded for the candidate (tests/data/offload-replay: steady steps of the
built-in tiny and wide models traced by the startup hook at two
sub_group_sizes each, the wide one writing gradients during the backward),
its compute scales with the sub-groups' elements, and what it cannot
represent is refused with why."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from iotune.model.offload import JobShape, OffloadKnobs, step_swap_bytes, sub_groups
from iotune.model.offload_schedule import (STATE_FILES, ReplayBase, align_starts, compute_rates, derive_schedule,
                                           group_id, replay_refusal, sub_group_members)
from iotune.model.replay import ScheduleError, SwapGroup, SwapOp, SwapSchedule
from iotune.workloads.presets import PRESETS, tensor_numels

DATA = Path(__file__).resolve().parents[1] / "data" / "offload-replay"
NVME = OffloadKnobs(optimizer_device="nvme")
TINY, WIDE = (JobShape(tuple(tensor_numels(PRESETS[m]))) for m in ("tiny", "wide"))
PREFIX = "zero_stage_3/optimizer/rank0/"


def traced(name: str) -> ReplayBase:
    return ReplayBase.from_json(json.loads((DATA / f"{name}.json").read_text()))


def ops(s: SwapSchedule) -> list[list[tuple[str, str, int]]]:
    return [[(op.direction, op.path, op.size_bytes) for op in g.ops] for g in s.groups]


def made_base(shape: JobShape, knobs: OffloadKnobs, adam_s: float = 1e-9) -> ReplayBase:
    """A steady step as DeepSpeed's partitioned swapper issues it, built by hand: every
    gradient written at the first swap-in (last tensor first), then per sub-group its state
    read, its gradients read and its state written, Adam's time before the writes."""
    members, parts = sub_group_members(knobs, shape), shape.partitions()
    ok = [4 * sum(parts[i] for i in m) >= knobs.min_swap_bytes for m in members]

    def grad(t: int, g: int, d: str) -> SwapOp:
        offset = sum(parts[i] for i in members[g] if i < t)
        return SwapOp(d, f"{PREFIX}{group_id(members[g])}_gradient_{offset}_{parts[t]}.tensor.swp", 4 * parts[t])
    grads = [(t, g) for g in reversed(range(len(members))) if ok[g] for t in reversed(members[g])
             if 4 * parts[t] >= knobs.min_swap_bytes]
    groups = [SwapGroup(tuple(grad(t, g, "write") for t, g in grads), 0.01, wait_s=0.01)] if grads else []
    for g, m in enumerate(members):
        if not ok[g]:
            continue
        n = sum(parts[i] for i in m)
        state = [PREFIX + f.format(id=group_id(m)) for f in STATE_FILES]
        groups.append(SwapGroup(tuple(SwapOp("read", p, 4 * n) for p in state), 0.001, wait_s=0.01))
        mine = [grad(t, g, "read") for t, gg in reversed(grads) if gg == g]
        if mine:
            groups.append(SwapGroup(tuple(mine), 0.001, wait_s=0.01))
        groups.append(SwapGroup(tuple(SwapOp("write", p, 4 * n) for p in state), adam_s * n, wait_s=0.01))
    optimizer_s = sum(g.gap_s + 0.01 for g in groups)
    return ReplayBase(SwapSchedule(tuple(groups), 1, optimizer_s, optimizer_s, source="made"), 0.5, 0.001)


KNOBS = [dict(sub_group_size=s) for s in (1, 100_000, 461_088, 922_176, 5_112_384, 10 ** 9)] + [
    dict(sub_group_size=5_112_384, block_size=8 << 20), dict(sub_group_size=20_449_536, block_size=16 << 20),
    dict(sub_group_size=461_088, intra_op_parallelism=4), dict(sub_group_size=922_176, optimizer_buffer_count=5),
    dict(sub_group_size=10_224_768, intra_op_parallelism=8, optimizer_buffer_count=6)]


@pytest.mark.parametrize("name,shape", [("tiny-1e9", TINY), ("wide-1e9", WIDE), ("wide-5112384", WIDE)])
@pytest.mark.parametrize("change", KNOBS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_a_derived_schedule_moves_the_byte_models_bytes_exactly(name: str, shape: JobShape,
                                                                 change: dict[str, int]) -> None:
    base = traced(name)
    base_knobs = replace(NVME, sub_group_size=int(name.split("-")[1].replace("1e9", "1000000000")))
    knobs = replace(NVME, **change)
    s = derive_schedule(base, base_knobs, knobs, shape)
    want = sum(step_swap_bytes(knobs, shape).values())
    assert (s.read_bytes, s.write_bytes) == (want, want)
    swapped = [g for g in sub_groups(knobs, shape) if 4 * g >= knobs.min_swap_bytes]
    assert sum(1 for g in s.groups if g.ops[0].direction == "read" and "gradient" not in g.ops[0].path) == \
        len(swapped)
    assert all(op.size_bytes % (1024 * knobs.intra_op_parallelism) == 0 for op in s.ops)


@pytest.mark.parametrize("ranks", [1, 2, 8])
@pytest.mark.parametrize("sub_group_size", [100_000_000, 250_000_000, 10 ** 9])
def test_at_1b_every_sub_group_size_moves_the_byte_models_bytes(ranks: int, sub_group_size: int) -> None:
    """A 1B Llama's tensors on 1, 2 and 8 ranks: gradients handed over in several reduce
    buckets, written during the backward as the buffers fill."""
    shape = JobShape(tuple(tensor_numels(PRESETS["1b"])), ranks)
    base_knobs = replace(NVME, sub_group_size=100_000_000)
    knobs = replace(NVME, sub_group_size=sub_group_size)
    s = derive_schedule(made_base(shape, base_knobs), base_knobs, knobs, shape)
    want = sum(step_swap_bytes(knobs, shape).values())
    assert (s.read_bytes, s.write_bytes) == (want, want)


@pytest.mark.parametrize("base,candidate,shape,size", [
    ("tiny-1e9", "tiny-461088", TINY, 461_088), ("tiny-461088", "tiny-1e9", TINY, 10 ** 9),
    ("wide-1e9", "wide-5112384", WIDE, 5_112_384), ("wide-5112384", "wide-1e9", WIDE, 10 ** 9)])
def test_the_derived_schedule_is_what_deepspeed_did_for_that_config(base: str, candidate: str, shape: JobShape,
                                                                    size: int) -> None:
    """Derived from one traced config, the other's schedule is its own trace, op for op and
    wait for wait: the same files, sizes and order, the wide model's gradient writes batched
    in the backward as its buffers filled (7 in the first batch at 5112384)."""
    b = traced(base)
    base_size = 10 ** 9 if base.endswith("1e9") else int(base.split("-")[1])
    derived = derive_schedule(b, replace(NVME, sub_group_size=base_size), replace(NVME, sub_group_size=size),
                              shape)
    assert ops(derived) == ops(traced(candidate).schedule)


def test_compute_scales_with_each_sub_groups_elements() -> None:
    """The base's compute per element, before the reads, the gradient reads and the writes
    (Adam), is spent per sub-group in proportion to its elements: the same in total for any
    cut, and Adam's time before each sub-group's writes is its share."""
    base = traced("tiny-1e9")
    rates = compute_rates(base, NVME, TINY)
    whole = derive_schedule(base, NVME, NVME, TINY)
    eighths = derive_schedule(base, NVME, replace(NVME, sub_group_size=461_088), TINY)
    assert whole.compute_s == pytest.approx(eighths.compute_s, rel=1e-6)
    writes = [g for g in eighths.groups if g.ops[0].direction == "write" and "gradient" not in g.ops[0].path]
    sizes = sub_groups(replace(NVME, sub_group_size=461_088), TINY)
    grads = [True] + [False] * (len(sizes) - 2) + [True]        # the embeddings' gradients: the first and last
    assert [g.gap_s for g in writes] == pytest.approx(
        [(rates.adam_s + (0 if mine else rates.gradient_s)) * n for n, mine in zip(sizes, grads)], rel=1e-6)
    assert rates.adam_s > 0 and whole.traced_s == base.window_s


def test_fewer_buffers_make_the_backward_wait_on_its_gradient_writes() -> None:
    """The wide model at 5112384: 4 buffers of its largest sub-group fill during the
    backward and it waits for them; 8 hold every gradient and it does not."""
    base = traced("wide-1e9")
    four, eight = (derive_schedule(base, NVME, replace(NVME, sub_group_size=5_112_384, optimizer_buffer_count=n),
                                   WIDE) for n in (4, 8))
    first = [g for g in four.groups if all("gradient" in op.path and op.direction == "write" for op in g.ops)]
    assert len(first) == 2 and len(first[0].ops) == 7                # one wait in the backward, then the flush
    assert len([g for g in eight.groups if g.ops[0].direction == "write" and "gradient" in g.ops[0].path]) == 1
    assert four.read_bytes == eight.read_bytes


def test_the_schedules_share_one_start() -> None:
    base = traced("wide-1e9")
    a, b = (derive_schedule(base, NVME, replace(NVME, sub_group_size=s), WIDE) for s in (10 ** 9, 5_112_384))
    x, y = align_starts([a, b])
    lead = min(a.groups[0].gap_s, b.groups[0].gap_s)
    assert min(x.groups[0].gap_s, y.groups[0].gap_s) == 0.0 and x.traced_s == pytest.approx(a.traced_s - lead)
    assert x.groups[0].gap_s - y.groups[0].gap_s == pytest.approx(a.groups[0].gap_s - b.groups[0].gap_s)


@pytest.mark.parametrize("base,knobs,says", [
    (NVME, replace(NVME, pipeline_read=True, optimizer_buffer_count=8), "pipelining: DeepSpeed's pipelined swapper"),
    (NVME, replace(NVME, optimizer_device="cpu"), "it moves state to another device"),
    (NVME, replace(NVME, param_device="nvme"), "it moves state to another device"),
    (NVME, replace(NVME, reduce_bucket_size=1000), "it changes reduce_bucket_size"),
    (replace(NVME, pipeline_write=True), NVME, "your config pipelines the optimizer's swaps"),
    (replace(NVME, optimizer_device="cpu"), NVME, "your config keeps the optimizer's state off NVMe"),
    (replace(NVME, param_device="nvme"), NVME, "your config swaps parameters"),
])
def test_what_a_replay_cannot_represent_is_refused_with_why(base: OffloadKnobs, knobs: OffloadKnobs,
                                                            says: str) -> None:
    assert replay_refusal(base, knobs).startswith(says)
    assert replay_refusal(NVME, replace(NVME, sub_group_size=1, block_size=2 << 20, intra_op_parallelism=2,
                                        optimizer_buffer_count=5)) == ""


def test_a_candidate_that_swaps_gradients_the_base_kept_is_not_derived() -> None:
    """The base at a 16 MiB block keeps the wide model's 1536 x 1536 gradients in RAM: where
    they come in the backward is not in its trace."""
    big = replace(NVME, block_size=16 << 20, sub_group_size=5_112_384)
    base = made_base(WIDE, big)
    with pytest.raises(ScheduleError, match=r"it swaps 4 gradient\(s\) your config keeps in RAM"):
        derive_schedule(base, big, replace(big, block_size=1 << 20), WIDE)


def test_a_trace_out_of_the_swappers_order_is_refused() -> None:
    base = traced("tiny-1e9")
    s = base.schedule
    swapped = replace(s, groups=(s.groups[0], s.groups[3], s.groups[1], s.groups[2]))
    with pytest.raises(ScheduleError, match="swaps in an order DeepSpeed's partitioned optimizer swapper does not"):
        derive_schedule(replace(base, schedule=swapped), NVME, NVME, TINY)
    with pytest.raises(ScheduleError, match="are not the offload model's for your config"):
        derive_schedule(base, replace(NVME, sub_group_size=461_088), NVME, TINY)


def test_a_replay_base_loads_what_it_saved() -> None:
    base = traced("wide-5112384")
    assert ReplayBase.from_json(json.loads(json.dumps(base.to_json()))) == base
    assert base.backward_s > 0 and base.schedule.traced_s > base.schedule.optimizer_s    # it swapped in the backward
