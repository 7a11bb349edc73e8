"""The replay of a swap schedule (iotune.sweep.replay, its child
iotune.sweep.replayer): it moves exactly the schedule's bytes with the
schedule's grouping, and a request that did not land is reported, never
counted as moved. The replay against a traced job on a capped drive is in
test_replay_bed.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from iotune.model.aio import AioSettings
from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule
from iotune.sweep.executor import Target
from iotune.sweep.replay import ReplayError, _parse, replay_argv, run_replays
from iotune.sweep.replay_io import IoCount, group_bytes
from iotune.sweep.replayer import Replay
from tests.conftest import needs_deepspeed

MiB = 1 << 20


def schedule(size: int = 4 * MiB) -> SwapSchedule:
    reads = tuple(SwapOp("read", f"optimizer/rank0/{n}.swp", size) for n in ("a", "b"))
    writes = tuple(SwapOp("write", f"optimizer/rank0/{n}.swp", size, after_s=0.001 * i)
                   for i, n in enumerate(("a", "b")))
    return SwapSchedule((SwapGroup(reads, gap_s=0.01, before_wait_s=0.002, wait_s=0.05),
                         SwapGroup((SwapOp("read", "optimizer/rank0/g.swp", MiB),), gap_s=0.001, wait_s=0.01),
                         SwapGroup(writes, gap_s=0.02, wait_s=0.05)),
                        step=1, optimizer_s=0.2, traced_s=0.2, tail_s=0.01)


def test_a_group_that_moved_less_than_its_ops_is_short_io() -> None:
    group = schedule().groups[2]
    replay = Replay(None, [], schedule(), Path("."), None)     # type: ignore[arg-type]
    assert replay._check(2, group, IoCount(0, 8 * MiB), []) == []
    [short] = replay._check(2, group, IoCount(0, 8 * MiB - 4096), [])
    assert short == (f"group 2: writes of {8 * MiB} bytes, the kernel counted {8 * MiB - 4096} submitted: a request "
                     "failed (misaligned size, ENOSPC, EIO) and DeepSpeed's aio does not report it; check the "
                     "alignment of the sizes, free space and dmesg")


def test_the_childs_error_is_raised_with_its_message(tmp_path: Path) -> None:
    fake = [sys.executable, "-c", "import json; print(json.dumps({'error': 'no room', 'kind': 'space'})); exit(1)"]
    with pytest.raises(ReplayError, match="^no room$"):
        run_replays(schedule(), Target(tmp_path), command=fake)
    assert list(tmp_path.iterdir()) == []          # its scratch directory is gone


def test_a_replay_killed_by_sigkill_names_the_oom_killer() -> None:
    with pytest.raises(ReplayError) as e:
        _parse(["replayer"], -9, b"", b"Setting accelerator to CPU.\n")
    assert str(e.value) == ("the replay was killed by SIGKILL (the kernel's OOM killer does this when host memory "
                            "runs out: `dmesg | grep -i 'out of memory'` tells); its stderr ends: Setting accelerator "
                            "to CPU.")
    with pytest.raises(ReplayError, match=r"^the replay was killed by SIGABRT \(DeepSpeed's aio aborts on a failed "):
        _parse(["replayer"], -6, b"", b"")


class LockedStandIn:
    """aio_handle's locked-tensor calls, as plain memory: what the pool asks for."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.freed = 0

    def new_cpu_locked_tensor(self, nbytes: int, example: object) -> object:
        import torch
        self.asked.append(nbytes)
        return torch.zeros(nbytes, dtype=torch.uint8)

    def free_cpu_locked_tensor(self, buf: object) -> None:
        self.freed += 1


@needs_deepspeed
def test_the_pool_locks_what_one_group_has_in_flight_not_ops_times_the_largest() -> None:
    """A 1B schedule's backward writes many small gradients in one group and its optimizer step reads a
    few large states in another: the replay once locked (ops of the largest group) x (the largest op),
    112 x 1.05 GB there, and was OOM-killed. It locks the largest group's own bytes, each op a
    page-aligned slice of its own."""
    from iotune.sweep.replay_io import BufferPool

    grads = SwapGroup(tuple(SwapOp("write", f"g{i}.swp", 5000 + i) for i in range(40)))
    states = SwapGroup(tuple(SwapOp("read", f"s{i}.swp", 3 * MiB + 1024) for i in range(3)))
    s = SwapSchedule((grads, states), step=1, optimizer_s=1.0, traced_s=1.0)
    assert group_bytes(grads) == 40 * 8192 and group_bytes(states) == 3 * (3 * MiB + 4096)
    handle = LockedStandIn()
    pool = BufferPool(handle, s)
    assert handle.asked == [3 * (3 * MiB + 4096)]            # not 40 x (3 MiB + 4 KiB)
    for group in (grads, states):
        views = pool.views(group.ops)
        assert [v.numel() for v in views] == [op.size_bytes for op in group.ops]
        starts = [v.data_ptr() - pool.buffer.data_ptr() for v in views]
        assert all(a % 4096 == 0 for a in starts)
        assert all(a + v.numel() <= b for a, b, v in zip(starts, starts[1:], views))     # none overlap
        assert starts[-1] + views[-1].numel() <= pool.nbytes
    assert [c.numel() for c in pool.chunks()] == [3 * MiB + 4096] * 3
    pool.free()
    assert handle.freed == 1


@needs_deepspeed
def test_the_pattern_shows_a_request_that_did_not_land() -> None:
    import torch

    from iotune.sweep.replay_io import Pattern
    pattern = Pattern(["a.swp", "b.swp"], 1024)
    buf = torch.zeros(MiB, dtype=torch.uint8)
    pattern.mark(buf, "a.swp", 0)
    assert pattern.first_bad(buf, "a.swp", 0) is None
    assert pattern.first_bad(buf, "b.swp", 0) == 0              # another file's bytes
    assert pattern.first_bad(buf, "a.swp", 4096) == 0           # the same file's, from elsewhere
    buf[512 * 1024:513 * 1024] = 0                              # one 1 KiB request never landed
    assert pattern.first_bad(buf, "a.swp", 0) == 512 * 1024
    pattern.poison(buf)
    assert pattern.first_bad(buf, "a.swp", 0) == 0


@needs_deepspeed
def test_a_replay_moves_exactly_the_schedules_bytes_in_its_groups(tmp_path: Path) -> None:
    s = schedule()
    [r, again] = run_replays(s, Target(tmp_path), AioSettings(block_size=256 << 10, queue_depth=4), repeats=2)
    for x in (r, again):
        assert (x.read_bytes, x.write_bytes) == (s.read_bytes, s.write_bytes) == (9 * MiB, 8 * MiB)
        assert [(w.read_bytes, w.write_bytes) for w in x.waits] == [(8 * MiB, 0), (MiB, 0), (0, 8 * MiB)]
        # the kernel's own count: at least the ops' bytes (now and then a page of ext4's metadata more)
        assert all(w.counted_read_bytes >= w.read_bytes and w.counted_write_bytes >= w.write_bytes for w in x.waits)
        assert [w.traced_wait_s for w in x.waits] == [0.05, 0.01, 0.05]
        assert x.complete and x.with_compute and x.short_io == ()
        assert x.seconds >= s.compute_s                         # the compute was slept
    assert r.aio == AioSettings(block_size=256 << 10, queue_depth=4)
    assert list(tmp_path.iterdir()) == []


@needs_deepspeed
def test_a_size_odirect_cannot_move_is_reported_not_counted(tmp_path: Path) -> None:
    """DeepSpeed's aio leaves a misaligned tail unwritten and still counts the op done. (The spine pads
    sizes as DeepSpeed does, 1 KiB x intra_op_parallelism, which a 4 KiB-sector drive still fails; the
    child is run directly here to give it a size no drive takes.)"""
    (tmp_path / "schedule.json").write_text(json.dumps(schedule(4 * MiB + 100).to_json()))
    files = tmp_path / "files"
    files.mkdir()
    argv = replay_argv(tmp_path / "schedule.json", files, AioSettings(), 1, True)
    child = subprocess.run([sys.executable, "-m", "iotune.sweep.replayer", *argv], capture_output=True, text=True,
                           timeout=300)
    out = json.loads(child.stdout)
    assert child.returncode == 1 and out["kind"] == "io", out
    assert re.match(r"laying out the schedule's files wrote \d+ of \d+ bytes .*: a request failed", out["error"])
