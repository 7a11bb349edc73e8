"""What a replay concludes (iotune.model.replay_result): fidelity against the
traced step, the job-pattern ceiling from repeated replays, and a run
measured faster than its ceiling caught; records load back from JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from iotune.errors import IotuneError
from iotune.model.aio import AioSettings
from iotune.model.replay import SwapGroup, SwapOp, SwapSchedule
from iotune.model.replay_result import (Fidelity, JobCeiling, ReplayResult, SettingRuns, WaitTiming,
                                        ceiling_from_runs, check_against_ceiling, fidelity, fraction_of_ceiling)

MB = 1_000_000
SCHEDULE = SwapSchedule((SwapGroup((SwapOp("read", "a.swp", 40 * MB),), gap_s=0.1, wait_s=1.0),
                         SwapGroup((SwapOp("write", "a.swp", 40 * MB),), gap_s=0.2, wait_s=1.0)),
                        step=2, optimizer_s=2.0, traced_s=2.0)


def result(seconds: float, with_compute: bool = True, read: int = 40 * MB) -> ReplayResult:
    return ReplayResult(seconds, read, 40 * MB, 40 * MB, 40 * MB,
                        (WaitTiming(0, 0.9, 1.0, read, 0, 1.0), WaitTiming(1, 0.9, 1.0, 0, 40 * MB, 1.0)),
                        AioSettings(), with_compute)


def test_a_replay_within_5_percent_can_rank_candidates() -> None:
    f = fidelity(SCHEDULE, result(2.09))
    assert f.ratio == pytest.approx(1.045) and f.can_rank
    assert f.sentence == ("the replay took 2.090 s against the traced step's 2.000 s (ratio 1.045): within 5%, "
                          "so the replay can rank candidates")


def test_a_replay_further_off_says_so_with_both_numbers() -> None:
    f = fidelity(SCHEDULE, result(1.8))
    assert not f.can_rank
    assert f.sentence == ("the replay took 1.800 s against the traced step's 2.000 s (ratio 0.900): more than 5% "
                          "apart, so the replay does not reproduce this job's step; rank candidates on real steps")


def test_a_ceiling_run_is_not_compared_with_the_traced_step() -> None:
    with pytest.raises(IotuneError, match="left the job's compute out"):
        fidelity(SCHEDULE, result(2.0, with_compute=False))


def test_complete_only_when_every_byte_moved() -> None:
    assert result(2.0).complete and result(2.0).bytes_per_s == pytest.approx(40 * MB)
    assert not result(2.0, read=39 * MB).complete
    assert not replace(result(2.0), short_io=("group 0: the read of a.swp did not bring back the file's bytes",)).complete


def runs() -> list[SettingRuns]:
    return [SettingRuns(AioSettings(), (40 * MB, 41 * MB, 39 * MB)),
            SettingRuns(AioSettings(queue_depth=32), (42 * MB, 44 * MB, 43 * MB, 41 * MB))]


def test_the_ceiling_is_the_best_settings_median_with_its_spread() -> None:
    c = ceiling_from_runs(runs(), SCHEDULE)
    assert c.aio == AioSettings(queue_depth=32)
    assert (c.bytes_per_s, c.min_bytes_per_s, c.max_bytes_per_s, c.count) == (42.5 * MB, 41 * MB, 44 * MB, 4)
    assert c.schedule_bytes == 80 * MB and c.step == 2
    assert c.sentence == ("42.5 MB/s (median of 4 replays of step 2's swap I/O without compute, 41.0-44.0 MB/s, "
                          "best of 2 aio settings)")


def test_a_ceiling_needs_three_repeats_at_every_setting() -> None:
    with pytest.raises(IotuneError, match="at least 3 replays"):
        ceiling_from_runs([SettingRuns(AioSettings(), (40 * MB, 41 * MB))], SCHEDULE)
    with pytest.raises(IotuneError, match="at least 3 replays"):
        ceiling_from_runs([], SCHEDULE)


def test_a_run_faster_than_its_ceiling_is_caught_and_the_fraction_never_passes_1() -> None:
    c = ceiling_from_runs(runs(), SCHEDULE)
    assert check_against_ceiling(44 * MB, c) is None            # within the ceiling's own spread
    assert fraction_of_ceiling(44 * MB, c) == 1.0
    assert fraction_of_ceiling(21.25 * MB, c) == pytest.approx(0.5)
    warning = check_against_ceiling(1570 * MB, c)
    assert warning is not None and warning.startswith("measured faster than the ceiling: re-measure. The run moved "
                                                      "1,570.0 MB/s, above the ceiling of 42.5 MB/s (median of 4")
    assert fraction_of_ceiling(1570 * MB, c) == 1.0


def test_records_load_back_from_json() -> None:
    c = ceiling_from_runs(runs(), SCHEDULE)
    assert JobCeiling.from_json(json.loads(json.dumps(c.to_json()))) == c
    r = result(2.0)
    assert ReplayResult.from_json(json.loads(json.dumps(r.to_json()))) == r
    f = fidelity(SCHEDULE, r)
    assert Fidelity.from_json(json.loads(json.dumps(f.to_json()))) == f
