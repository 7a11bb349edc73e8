"""The replayer's --plan (iotune.sweep.replayer, iotune.sweep.replay.run_replay_plan):
several schedules, each at its own aio setting, replayed in one child in
the order given (the offload search's ABBA pairs of a candidate and your
config), each moving exactly its own bytes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from iotune.errors import UsageError
from iotune.model.aio import AioSettings
from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule
from iotune.sweep.executor import Target
from iotune.sweep.replay import ReplayError, run_replay_plan
from iotune.sweep.replayer import ReplayFailure, parse_args
from tests.conftest import needs_deepspeed

MiB = 1 << 20


def schedule(files: int, size: int = 2 * MiB) -> SwapSchedule:
    reads = tuple(SwapOp("read", f"optimizer/rank0/{i}.swp", size) for i in range(files))
    writes = tuple(SwapOp("write", f"optimizer/rank0/{i}.swp", size) for i in range(files))
    return SwapSchedule((SwapGroup(reads, 0.001, wait_s=0.01), SwapGroup(writes, 0.002, wait_s=0.01)), 1, 0.05, 0.05)


def write_plan(tmp: Path, order: list[int], files: tuple[int, ...] = (1, 3)) -> Path:
    plan = {"entries": [{"schedule": schedule(n).to_json(), "aio": AioSettings(block_size=(1 << 20) >> i).to_ds_json()}
                        for i, n in enumerate(files)],
            "order": order}
    (tmp / "plan.json").write_text(json.dumps(plan))
    return tmp / "plan.json"


def test_a_plan_puts_each_set_of_files_in_a_directory_of_its_own_and_keeps_the_order(tmp_path: Path) -> None:
    """Schedules with other files get a directory each; the same files at other aio settings (the
    job's schedule against a candidate's block size) share one, laid out once."""
    args = parse_args(["--plan", str(write_plan(tmp_path, [1, 0, 0, 1])), "--dir", str(tmp_path)])
    assert args.sequence == (1, 0, 0, 1) and [a for _, a in args.entries] == [AioSettings(),
                                                                           AioSettings(block_size=512 << 10)]
    assert sorted(args.entries[0][0].files()) == ["s0/optimizer/rank0/0.swp"]
    assert sorted(args.entries[1][0].files())[0] == "s1/optimizer/rank0/0.swp"
    shared = parse_args(["--plan", str(write_plan(tmp_path, [0, 1, 2], (3, 1, 3))), "--dir", str(tmp_path)])
    assert [sorted(s.files())[0] for s, _ in shared.entries] == ["s0/optimizer/rank0/0.swp",
                                                                 "s1/optimizer/rank0/0.swp",
                                                                 "s0/optimizer/rank0/0.swp"]
    with pytest.raises(ReplayFailure, match="needs schedules and an order of their indices"):
        parse_args(["--plan", str(write_plan(tmp_path, [0, 2])), "--dir", str(tmp_path)])
    with pytest.raises(ReplayFailure, match="give either --schedule .* or --plan"):
        parse_args(["--dir", str(tmp_path)])


def test_the_parent_pairs_each_result_with_its_schedule(tmp_path: Path) -> None:
    result = {"seconds": 0.1, "read_bytes": 2 * MiB, "write_bytes": 2 * MiB, "waits": []}
    fake = [sys.executable, "-c", f"import json; print(json.dumps({{'results': [{json.dumps(result)}] * 2}}))"]
    entries = [(schedule(1), AioSettings()), (schedule(1), AioSettings())]
    got = run_replay_plan(entries, [1, 0], Target(tmp_path), command=fake)
    assert [i for i, _ in got] == [1, 0] and got[0][1].seconds == 0.1
    with pytest.raises(ReplayError, match="returned 2 results for 3 replays"):
        run_replay_plan(entries, [1, 0, 0], Target(tmp_path), command=fake)
    with pytest.raises(UsageError, match="an order of indices into its 2 schedule"):
        run_replay_plan(entries, [2], Target(tmp_path), command=fake)
    assert list(tmp_path.iterdir()) == []


@needs_deepspeed
def test_each_schedule_of_a_plan_moves_its_own_bytes_at_its_own_setting(tmp_path: Path) -> None:
    entries = [(schedule(1), AioSettings()), (schedule(3), AioSettings(block_size=256 << 10, queue_depth=4))]
    got = run_replay_plan(entries, [1, 0, 0, 1], Target(tmp_path))
    assert [i for i, _ in got] == [1, 0, 0, 1]
    for i, r in got:
        s, aio = entries[i]
        assert (r.read_bytes, r.write_bytes) == (s.read_bytes, s.write_bytes) and r.complete and r.aio == aio
    assert list(tmp_path.iterdir()) == []


@needs_deepspeed
def test_a_callers_directory_can_link_a_schedule_to_another_drive(tmp_path: Path) -> None:
    """In a directory of the caller's, schedule k's files go under s<k>, which may be a link to an
    empty directory elsewhere (another drive); a link to a directory that holds files is refused."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    (here / "s1").symlink_to(there)
    entries = [(schedule(1), AioSettings()), (schedule(3), AioSettings())]
    got = run_replay_plan(entries, [1, 0], Target(tmp_path), directory=here)
    assert [(r.read_bytes, r.write_bytes) for _, r in got] == [(6 * MiB, 6 * MiB), (2 * MiB, 2 * MiB)]
    assert {p.name: p.stat().st_size for p in (there / "optimizer" / "rank0").iterdir()} == {
        "0.swp": 2 * MiB, "1.swp": 2 * MiB, "2.swp": 2 * MiB}
    assert [p.name for p in (here / "s0" / "optimizer" / "rank0").iterdir()] == ["0.swp"]
    shutil.rmtree(here / "s0")                   # left: the link, to a directory that now holds files
    with pytest.raises(ReplayError, match="must be an empty directory on the drive under test"):
        run_replay_plan(entries, [1, 0], Target(tmp_path), directory=here)
