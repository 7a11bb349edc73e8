"""The job's swap schedule (iotune.model.replay) from hand-built hook events:
the ops grouped by the wait that completes them, the compute around them,
the step chosen, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from iotune.model.replay import READ, WRITE, ScheduleError, SwapSchedule, read_swap_schedule, swap_schedule

MS = 1_000_000            # ns
MiB = 1 << 20
SWAP = "/mnt/nvme/swap/zero_stage_3/optimizer/rank0"
MASTER, AVG, AVG_SQ = f"{SWAP}/0_38.tensor.swp", f"{SWAP}/exp_avg-0_38.tensor.swp", f"{SWAP}/exp_avg_sq-0_38.tensor.swp"
GRAD = f"{SWAP}/0_38_gradient_0_262144.tensor.swp"
STATE = 15 * MiB


def swap(d: str, path: str, nbytes: int, step: int, t_ms: float, phase: str = "optimizer") -> dict[str, Any]:
    return {"k": "swap", "d": d, "p": path, "b": nbytes, "s": step, "n": phase, "t": int(t_ms * MS)}


def wait(step: int, t0_ms: float, t1_ms: float, phase: str = "optimizer") -> dict[str, Any]:
    return {"k": "wait", "s": step, "n": phase, "t0": int(t0_ms * MS), "t1": int(t1_ms * MS)}


def phase(name: str, step: int, t0_ms: float, t1_ms: float) -> dict[str, Any]:
    return {"k": "phase", "n": name, "s": step, "t0": int(t0_ms * MS), "t1": int(t1_ms * MS)}


def steady_step(step: int, at_ms: float, io_ms: float = 40.0) -> list[dict[str, Any]]:
    """A steady step as DeepSpeed's partitioned swapper does it: gradients flushed, the
    three states read, the gradient read, Adam, the three states written."""
    t = at_ms
    return [
        phase("forward", step, t, t + 100), phase("backward", step, t + 100, t + 300),
        swap("w", GRAD, MiB, step, t + 302),
        wait(step, t + 302.5, t + 304),
        swap("r", MASTER, STATE, step, t + 305), swap("r", AVG, STATE, step, t + 305),
        swap("r", AVG_SQ, STATE, step, t + 306),
        wait(step, t + 306.5, t + 306.5 + io_ms),
        swap("r", GRAD, MiB, step, t + 310 + io_ms),
        wait(step, t + 310.2 + io_ms, t + 312 + io_ms),
        swap("w", MASTER, STATE, step, t + 322 + io_ms), swap("w", AVG, STATE, step, t + 322 + io_ms),
        swap("w", AVG_SQ, STATE, step, t + 322 + io_ms),
        wait(step, t + 323 + io_ms, t + 323 + 2 * io_ms),
        phase("optimizer", step, t + 300, t + 325 + 2 * io_ms),
    ]


def first_step() -> list[dict[str, Any]]:
    """Engine init (phase "") and step 0: the moments created, written twice what is read."""
    return [swap("w", MASTER, STATE, 0, 1, ""), wait(0, 2, 10, ""),
            phase("forward", 0, 20, 120), phase("backward", 0, 120, 320),
            swap("r", MASTER, STATE, 0, 322), wait(0, 323, 340),
            swap("w", MASTER, STATE, 0, 350), swap("w", AVG, STATE, 0, 350), swap("w", AVG_SQ, STATE, 0, 350),
            wait(0, 351, 400), phase("optimizer", 0, 320, 402)]


def job(io_ms: tuple[float, ...] = (40.0, 50.0, 45.0)) -> list[dict[str, Any]]:
    events = [{"k": "proc", "pid": 7, "rank": 0}] + first_step()
    for i, io in enumerate(io_ms, start=1):
        events += steady_step(i, 1000.0 * i, io)
    return events


def test_ops_are_grouped_by_the_wait_that_completes_them() -> None:
    s = swap_schedule(job(), step=1)
    assert [[(op.direction, op.path.rsplit("/", 1)[-1]) for op in g.ops] for g in s.groups] == [
        [(WRITE, "0_38_gradient_0_262144.tensor.swp")],
        [(READ, "0_38.tensor.swp"), (READ, "exp_avg-0_38.tensor.swp"), (READ, "exp_avg_sq-0_38.tensor.swp")],
        [(READ, "0_38_gradient_0_262144.tensor.swp")],
        [(WRITE, "0_38.tensor.swp"), (WRITE, "exp_avg-0_38.tensor.swp"), (WRITE, "exp_avg_sq-0_38.tensor.swp")]]
    assert all(op.offset_bytes == 0 for op in s.ops)
    assert s.groups[1].ops[0].path == "zero_stage_3/optimizer/rank0/0_38.tensor.swp"    # relative to nvme_path


def test_the_compute_around_the_waits_is_kept() -> None:
    s = swap_schedule(job(), step=1)
    g = s.groups
    assert g[0].gap_s == pytest.approx(0.002)            # optimizer phase start -> first submit
    assert g[0].before_wait_s == pytest.approx(0.0005)   # submit -> wait: overlapped with the I/O
    assert g[1].gap_s == pytest.approx(0.001)            # previous wait's end -> next submit
    assert g[2].gap_s == pytest.approx(0.0035)
    assert [op.after_s for op in g[1].ops] == pytest.approx([0.0, 0.0, 0.001])
    assert g[1].wait_s == pytest.approx(0.040)
    assert g[3].gap_s == pytest.approx(0.010)            # Adam
    assert s.tail_s == pytest.approx(0.002)
    assert s.optimizer_s == s.traced_s == pytest.approx(0.105)
    assert s.compute_s == pytest.approx(0.002 + 0.0005 + 0.001 + 0.001 + 0.0005 + 0.0035 + 0.0002 + 0.010 + 0.001
                                        + 0.002)


def test_the_compute_is_the_step_less_its_waits_with_several_ops_in_a_group() -> None:
    """Each op's after_s counts from its group's first submit, so a group's compute is its last
    op's after_s (the replayer sleeps to first + after_s), not their sum: a step of two groups of
    three ops, each submitted apart, computes exactly its 100 ms less its two 40 ms waits."""
    events = [phase("optimizer", 1, 1000, 1100),
              swap("r", MASTER, STATE, 1, 1002), swap("r", AVG, STATE, 1, 1003), swap("r", AVG_SQ, STATE, 1, 1005),
              wait(1, 1006, 1046),
              swap("w", MASTER, STATE, 1, 1050), swap("w", AVG, STATE, 1, 1052), swap("w", AVG_SQ, STATE, 1, 1056),
              wait(1, 1057, 1097)]
    s = swap_schedule(events, step=1)
    assert [op.after_s for op in s.ops] == pytest.approx([0.0, 0.001, 0.003, 0.0, 0.002, 0.006])
    assert [t for g in s.groups for t in (g.gap_s, g.before_wait_s, g.wait_s)] == pytest.approx(
        [0.002, 0.001, 0.040, 0.004, 0.001, 0.040])
    assert s.tail_s == pytest.approx(0.003) and s.traced_s == pytest.approx(0.100)
    assert s.compute_s == pytest.approx(0.002 + 0.003 + 0.001 + 0.004 + 0.006 + 0.001 + 0.003)     # 20 ms, not 23
    assert s.compute_s + sum(g.wait_s or 0.0 for g in s.groups) == pytest.approx(s.traced_s)


def test_totals_and_files() -> None:
    s = swap_schedule(job(), step=2)
    assert s.read_bytes == 3 * STATE + MiB and s.write_bytes == 3 * STATE + MiB
    assert s.total_bytes == 2 * (3 * STATE + MiB)
    assert s.files() == {"zero_stage_3/optimizer/rank0/0_38_gradient_0_262144.tensor.swp": MiB,
                         "zero_stage_3/optimizer/rank0/0_38.tensor.swp": STATE,
                         "zero_stage_3/optimizer/rank0/exp_avg-0_38.tensor.swp": STATE,
                         "zero_stage_3/optimizer/rank0/exp_avg_sq-0_38.tensor.swp": STATE}


def test_without_compute_keeps_the_io_and_drops_every_compute_time() -> None:
    s = swap_schedule(job(), step=1)
    bare = s.without_compute()
    assert bare.compute_s == 0.0 and s.compute_s > 0
    assert bare.ops == tuple(op.__class__(op.direction, op.path, op.size_bytes, op.offset_bytes, 0.0) for op in s.ops)
    assert [g.wait_s for g in bare.groups] == [g.wait_s for g in s.groups]
    assert (bare.read_bytes, bare.write_bytes, bare.traced_s) == (s.read_bytes, s.write_bytes, s.traced_s)


def test_json_round_trip_and_older_files() -> None:
    s = swap_schedule(job(), source="events/")
    assert SwapSchedule.from_json(json.loads(json.dumps(s.to_json()))) == s
    old = {"step": 3, "optimizer_s": 1.5, "traced_s": 1.5,
           "groups": [{"ops": [{"d": "read", "p": "a/b.swp", "b": 4096}]}]}
    loaded = SwapSchedule.from_json(old)
    assert loaded.read_bytes == 4096 and loaded.groups[0].wait_s is None and loaded.rank == 0


def test_the_default_step_is_the_steady_one_with_the_median_optimizer_time() -> None:
    assert swap_schedule(job((40.0, 50.0, 45.0))).step == 3
    assert swap_schedule(job((60.0, 50.0, 45.0))).step == 2


def test_the_first_step_is_refused_with_why() -> None:
    with pytest.raises(ScheduleError, match=r"step 0 is not steady: it creates Adam's moments .*\(steady steps in "
                                            r"these events: 1, 2, 3\)"):
        swap_schedule(job(), step=0)
    with pytest.raises(ScheduleError, match="no steady optimizer step"):
        swap_schedule([{"k": "proc", "rank": 0}] + first_step())


def test_an_overflow_skipped_step_that_only_writes_is_not_steady() -> None:
    events = job((40.0,)) + [swap("w", MASTER, STATE, 2, 3000), wait(2, 3001, 3040), phase("optimizer", 2, 2990, 3041)]
    with pytest.raises(ScheduleError, match="step 2 is not a completed step that read swap files"):
        swap_schedule(events, step=2)


def test_a_step_that_swaps_parameters_is_refused() -> None:
    param = "/mnt/nvme/swap/zero_stage_3/bfloat16params/rank0/0_param.tensor.swp"
    events = job((40.0,))
    events.insert(-3, swap("r", param, 2 * MiB, 1, 1200, "forward"))
    with pytest.raises(ScheduleError, match="swaps parameters to NVMe .* measure real steps instead"):
        swap_schedule(events, step=1)


def test_swaps_before_the_optimizer_phase_extend_the_traced_window() -> None:
    """Gradients written in the backward (a full gradient buffer) are the step's I/O: the window
    the replay is compared with starts at their submit."""
    events = job((40.0,))
    events.insert(2 + len(first_step()), swap("w", GRAD, MiB, 1, 1150, "backward"))
    s = swap_schedule(events, step=1)
    assert s.groups[0].ops[0].after_s == 0.0 and len(s.groups[0].ops) == 2
    assert s.groups[0].gap_s == 0.0
    assert s.traced_s == pytest.approx(s.optimizer_s + 0.150)
    assert s.write_bytes == 3 * STATE + 2 * MiB


def test_ops_pending_at_the_end_of_the_step_form_a_group_without_a_traced_wait() -> None:
    events = job((40.0,))
    end = events.pop()
    events += [swap("w", GRAD, MiB, 1, 1390), end]
    s = swap_schedule(events, step=1)
    assert s.groups[-1].wait_s is None and s.groups[-1].ops[0].size_bytes == MiB


def test_checkpoint_swaps_and_other_steps_are_left_out() -> None:
    events = job((40.0, 50.0))
    events.insert(-1, swap("r", MASTER, STATE, 1, 1200, "checkpoint"))
    assert swap_schedule(events, step=1) == swap_schedule(job((40.0, 50.0)), step=1)


def test_unsized_ops_are_refused() -> None:
    events = job((40.0,))
    events[-3]["b"] = -1
    with pytest.raises(ScheduleError, match="could not size the swap"):
        swap_schedule(events, step=1)


def test_paths_are_relative_to_the_given_swap_dir_and_stay_inside_it() -> None:
    s = swap_schedule(job((40.0,)), step=1, swap_dir="/mnt/nvme/swap/zero_stage_3")
    assert s.groups[1].ops[0].path == "optimizer/rank0/0_38.tensor.swp"
    with pytest.raises(ScheduleError, match="not relative to the swap directory"):
        swap_schedule(job((40.0,)), step=1, swap_dir="/mnt/other")
    bad = {"step": 1, "groups": [{"ops": [{"d": "read", "p": "../../etc/passwd", "b": 4096}]}]}
    with pytest.raises(ScheduleError, match="not relative"):
        SwapSchedule.from_json(bad)


def test_read_from_an_events_directory(tmp_path: Path) -> None:
    other = [{"k": "proc", "pid": 8, "rank": 1}] + [dict(ev, b=ev["b"] * 2) if ev["k"] == "swap" else ev
                                                    for ev in job()[1:]]
    for name, events in (("events-7.jsonl", job()), ("events-8.jsonl", other)):
        (tmp_path / name).write_text("".join(json.dumps(ev) + "\n" for ev in events))
    assert read_swap_schedule(tmp_path, step=2).read_bytes == 3 * STATE + MiB
    assert read_swap_schedule(tmp_path, step=2, rank=1).read_bytes == 2 * (3 * STATE + MiB)
    with pytest.raises(ScheduleError, match="no process of rank 2"):
        read_swap_schedule(tmp_path, rank=2)


def test_sizes_follow_deepspeeds_padding_at_another_intra_op_parallelism() -> None:
    s = swap_schedule(job((40.0,)), step=1)
    assert s.for_intra_op_parallelism(1) == s                  # traced at 1 thread: already padded
    odd = SwapSchedule.from_json({"step": 1, "traced_s": 1.0, "groups": [{"ops": [
        {"d": "read", "p": "a.swp", "b": 14_754_816}, {"d": "write", "p": "b.swp", "b": MiB}]}]})
    four = odd.for_intra_op_parallelism(4)
    assert [op.size_bytes for op in four.ops] == [14_757_888, MiB]     # up to 4 KiB: what DeepSpeed pads to
    with pytest.raises(ScheduleError, match="at least 1"):
        odd.for_intra_op_parallelism(0)


def test_the_traced_rate_is_the_steps_bytes_over_its_time() -> None:
    s = swap_schedule(job((40.0,)), step=1)
    assert s.traced_bytes_per_s == pytest.approx(s.total_bytes / 0.105)


def test_a_larger_block_size_keeps_the_tensors_under_it_in_ram_as_deepspeed_does() -> None:
    """DeepSpeed swaps no tensor under max(1 MiB, block_size): at 4 MiB blocks the job's 1 MiB gradients stay in
    RAM, their group and its wait go, and its compute moves on to the next group; at 16 MiB nothing is swapped."""
    from iotune.model.replay import SwapGroup, SwapOp

    grads = (SwapOp(WRITE, "g0.swp", MiB), SwapOp(WRITE, "g1.swp", MiB, after_s=0.002))
    states = (SwapOp(READ, "p.swp", 14 * MiB), SwapOp(READ, "m.swp", 2 * MiB, after_s=0.003),
              SwapOp(READ, "v.swp", 14 * MiB, after_s=0.005))
    s = SwapSchedule((SwapGroup(grads, gap_s=0.01, before_wait_s=0.001, wait_s=0.1),
                      SwapGroup(states, gap_s=0.02, before_wait_s=0.004, wait_s=0.3),
                      SwapGroup(grads, gap_s=0.03, wait_s=0.1)), step=1, optimizer_s=0.6, traced_s=0.6, tail_s=0.05)
    assert s.swapped_at(1 << 20) == s == s.swapped_at(128 << 10)
    at4 = s.swapped_at(4 * MiB)
    [g] = at4.groups
    assert [op.path for op in g.ops] == ["p.swp", "v.swp"] and g.wait_s == 0.3
    assert g.gap_s == pytest.approx(0.01 + 0.002 + 0.001 + 0.02)         # the first group's compute, then its own
    assert [op.after_s for op in g.ops] == [0.0, 0.005] and g.before_wait_s == pytest.approx(0.004)
    assert at4.tail_s == pytest.approx(0.05 + 0.03 + 0.002)
    assert at4.compute_s == pytest.approx(s.compute_s) == pytest.approx(0.124)
    assert at4.read_bytes == 28 * MiB and at4.write_bytes == 0
    assert s.swapped_at(16 * MiB).groups == ()
