"""Sweep pieces: ranking, journal, profiles, fio on real output, recommendation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import needs_fio, needs_root_for
from click.testing import CliRunner

from iotune.cli import cli
from iotune.errors import RecordError, UsageError
from iotune.model.journal import SweepEnv
from iotune.model.sweep import Measurement, SweepPoint, Trial
from iotune.sweep.executor import Target, TrialFailed
from iotune.sweep.fio_executor import FioExecutor, fio_jobfile, parse_fio_json
from iotune.sweep.journal import Journal
from iotune.sweep.aio.recommend import ds_fragment
from iotune.sweep.config import aio_block_changes, apply_to_config
from iotune.sweep.measure import Measurer
from iotune.sweep.aio.pipeline import search
from iotune.sweep.aio.rank import rank, summarize_trials
from iotune.sweep.space import RunSettings, SearchSpace, load_profile

MB = 1_000_000
needs_root = needs_root_for("mount -t ramfs")


def trial(point: SweepPoint, mbps: float, repeat: int = 0, status: str = "ok") -> Trial:
    m = Measurement(read_bytes_per_s=mbps * MB, write_bytes_per_s=mbps * MB) if status == "ok" else None
    return Trial("fio", point, repeat, status, m)


def test_a_tie_does_not_give_up_measured_throughput_for_a_cheaper_point() -> None:
    """The 256K/qd4 case: inside the noise band the faster median still
    leads; only medians the trials cannot tell apart go to the cheaper point."""
    big = SweepPoint(block_size=4 << 20, queue_depth=32)
    small = SweepPoint(block_size=1 << 20, queue_depth=4)
    slow = SweepPoint(block_size=128 << 10, queue_depth=1)
    rows = summarize_trials([trial(big, 200), trial(big, 201, 1), trial(small, 199), trial(small, 198, 1),
                             trial(slow, 50), trial(slow, 0, 1, "failed")], "fio")
    ranked = rank(rows)
    assert [r.point for r in ranked] == [big, small, slow]      # 200.5 vs 198.5: a tie, and big is faster
    assert ranked[2].failed == 1 and ranked[2].scores == (50 * MB,)
    same = summarize_trials([trial(big, 200.0), trial(small, 200.1)], "fio")   # 0.05 %: below the resolution
    assert [r.point for r in rank(same)] == [small, big]
    assert [r.point for r in rank(list(reversed(same)))] == [small, big]        # order of rows does not matter


def test_clear_differences_are_not_ties() -> None:
    a, b = SweepPoint(block_size=1 << 20), SweepPoint(block_size=128 << 10)
    ranked = rank(summarize_trials([trial(a, 200), trial(b, 105)], "fio"))
    assert [r.point for r in ranked] == [a, b]


def test_score_is_harmonic_mean_of_read_and_write() -> None:
    assert Measurement(read_bytes_per_s=100, write_bytes_per_s=300).score == 150
    assert Measurement(step_s=0.5).score == 2.0


def test_journal_replays_and_survives_a_partial_line(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.jsonl")
    j.start(SweepEnv(kernel="x"))
    p = SweepPoint(block_size=512 << 10)
    j.record(trial(p, 100))
    with (tmp_path / "journal.jsonl").open("a") as fh:
        fh.write('{"kind": "trial", "executor": "fio", "poi')      # killed mid-write
    again = Journal(tmp_path / "journal.jsonl")
    assert len(again.trials) == 1 and again.done("fio", p.key(), 0) is not None
    assert again.done("fio", p.key(), 1) is None and again.env == SweepEnv(kernel="x")


def test_a_damaged_journal_is_a_record_error_naming_file_line_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.start(SweepEnv(kernel="x"))
    j.record(trial(SweepPoint(), 100))
    with path.open("a") as fh:
        fh.write('{"kind": "trial", "executor": "fio", "point": 7}\n')
    with pytest.raises(RecordError) as info:
        Journal(path)
    assert str(info.value) == (f"{path}:3: not a trial record (AttributeError: 'int' object has no attribute "
                               "'items'); the sweep journal is damaged: fix or delete that line to resume, or "
                               "start a new journal with --fresh (the old one is kept) or another --out")
    path.write_text('{"kind": "header", "version": 2, "env": {}}\n')
    with pytest.raises(RecordError) as info:
        Journal(path)
    assert str(info.value) == (f"{path}:1: journal version 2 was written by a newer iotune (this one reads "
                               "version 1): upgrade iotune, or start a new journal with --fresh (the old one "
                               "is kept) or another --out")


def test_export_reads_the_journal_with_the_same_checks(tmp_path: Path) -> None:
    from iotune.analysis.sweep_frames import export_trials

    path = tmp_path / "journal.jsonl"
    path.write_text('{"kind": "header", "version": 2, "env": {}}\n')
    with pytest.raises(RecordError, match=r"journal.jsonl:1: journal version 2 was written by a newer iotune"):
        export_trials(path, tmp_path / "t.csv")


def test_from_fields_ignores_unknown_keys_and_defaults_missing_ones() -> None:
    assert SweepPoint.from_json({"block_size": 4096, "future": 1}) == SweepPoint(block_size=4096)
    assert Measurement.from_json({"step_s": 0.5, "gone": 2}) == Measurement(step_s=0.5)


class CountingExecutor:
    """Deterministic stand-in for a drive: bandwidth = min(200, qd x bs / 4 ms)."""

    name = "fio"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, point: SweepPoint, target: Target):
        self.calls.append(point.key())
        if point.block_size >= 16 << 20:
            raise TrialFailed("no space left on device")
        mbps = min(200.0, point.queue_depth * point.block_size / 0.004 / MB)
        return Measurement(read_bytes_per_s=mbps * MB, write_bytes_per_s=mbps * MB), {}


def test_adaptive_search_resume_skips_completed_trials(tmp_path: Path) -> None:
    space = SearchSpace(block_size=(128 << 10, 256 << 10, 1 << 20, 16 << 20), queue_depth=(1, 2, 4, 8),
                        intra_op_parallelism=(1, 2), single_submit=(False,), overlap_events=(True,))
    settings = RunSettings(repeats=2, finalists=2)
    first = CountingExecutor()
    full = search(Measurer(first, Target(tmp_path), Journal(tmp_path / "a.jsonl")), space, settings)
    # the same sweep, "killed" after 5 trials, then resumed
    partial = Journal(tmp_path / "b.jsonl")
    for t in Journal(tmp_path / "a.jsonl").trials[:5]:
        partial.record(t)
    second = CountingExecutor()
    resumed = search(Measurer(second, Target(tmp_path), Journal(tmp_path / "b.jsonl")), space, settings)
    assert len(second.calls) == len(first.calls) - 5        # the 5 journaled trials were not re-run
    resumed_trials = Journal(tmp_path / "b.jsonl").trials
    ids = [(t.executor, t.point.key(), t.repeat) for t in resumed_trials]
    assert len(ids) == len(set(ids)) == len(Journal(tmp_path / "a.jsonl").trials)
    assert [r.point for r in resumed] == [r.point for r in full]
    failed = [t for t in Journal(tmp_path / "b.jsonl").trials if t.status == "failed"]
    assert failed and failed[0].error == "no space left on device"      # recorded, sweep went on
    best = full[0].point
    assert best.queue_depth * best.block_size / 0.004 >= 200 * MB          # reaches the ceiling
    assert best.intra_op_parallelism == 1                                    # cheapest of the tied


def test_profiles_load_and_errors_name_key_and_line(tmp_path: Path) -> None:
    assert load_profile("default").space.block_size[0] == 128 << 10
    bad = tmp_path / "p.toml"
    bad.write_text('[space]\nblock_size = ["1M"]\nqueue_dept = [4]\n')
    with pytest.raises(UsageError, match=r"\[space\] queue_dept \(line 3\): unknown key"):
        load_profile(str(bad))
    bad.write_text('[space]\nsingle_submit = ["false"]\n')
    with pytest.raises(UsageError, match=r"single_submit \(line 2\): 'false': expected true or false"):
        load_profile(str(bad))
    bad.write_text('[space]\nblock_size = [1M]\n')
    with pytest.raises(UsageError, match=r"p.toml: .*line 2"):
        load_profile(str(bad))
    with pytest.raises(UsageError, match="no profile 'nope': give a file or one of: default"):
        load_profile("nope")


@needs_fio
def test_fio_real_output_and_job_file(tmp_path: Path) -> None:
    target = Target(tmp_path, file_bytes=4 << 20, files=2)
    point = SweepPoint(block_size=256 << 10, queue_depth=4)
    m, raw = FioExecutor().run(point, target)
    ios = 2 * (4 << 20) // (256 << 10)
    swap_in = next(j for j in raw["fio"]["jobs"] if j["jobname"] == "swap-in")
    assert swap_in["read"]["io_bytes"] == 2 * (4 << 20) and swap_in["read"]["total_ios"] == ios
    assert m.read_bytes_per_s > 0 and m.write_bytes_per_s > 0 and m.read_lat_p50_us is not None
    assert list(tmp_path.iterdir()) == []                                  # files unlinked
    job = tmp_path / "point.fio"
    job.write_text(fio_jobfile(point, target))
    out = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, check=True)
    again = parse_fio_json(json.loads(out.stdout[out.stdout.index("{"):]))
    assert again.read_bytes_per_s > 0
    job.unlink()


@needs_fio
def test_fio_failure_is_a_failed_trial(tmp_path: Path) -> None:
    with pytest.raises(TrialFailed, match="fio failed"):
        FioExecutor().run(SweepPoint(), Target(tmp_path / "missing", 4 << 20, 1))


@needs_fio
def test_threads_that_leave_less_than_a_block_per_file_are_refused_before_fio(tmp_path: Path) -> None:
    """3 files of 32 MiB over 8 threads: 12 MiB a thread, 4 MiB of each file;
    an 8 MiB block fits in none (fio would say 'blocksize is larger than data
    set range'). 4 MiB blocks, or 4 threads, fit and are measured."""
    target = Target(tmp_path, file_bytes=32 << 20, files=3, runtime_s=0.5)
    with pytest.raises(TrialFailed, match=r"^8 threads sharing each 33554432 B file leave each less than one "
                                          r"8388608 B block; raise --file-bytes or lower the block size"):
        FioExecutor().run(SweepPoint(block_size=8 << 20, queue_depth=4, intra_op_parallelism=8), target)
    assert list(tmp_path.iterdir()) == []                                   # fio never started
    for bs, threads in ((4 << 20, 8), (8 << 20, 4)):
        m, _ = FioExecutor().run(SweepPoint(block_size=bs, queue_depth=4, intra_op_parallelism=threads), target)
        assert m.read_bytes_per_s > 0 and m.write_bytes_per_s > 0


def test_fragment_merge_and_apply(tmp_path: Path) -> None:
    frag = ds_fragment(SweepPoint(block_size=512 << 10, queue_depth=16), "/sweep/dir")
    assert frag["aio"] == {"block_size": 524288, "queue_depth": 16, "intra_op_parallelism": 1,
                           "single_submit": False, "overlap_events": True, "use_gds": False}
    user = {"train_batch_size": 8, "aio": {"num_threads": 4},
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/mine"}}}
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps(user))
    # --apply writes the aio keys the sweep decided, not the fragment: nothing of its offload block
    applied = apply_to_config(cfg, aio_block_changes(SweepPoint(block_size=512 << 10, queue_depth=16).aio()),
                              in_place=False)
    out = applied.written
    assert out.name == "ds_config.iotune.json" and json.loads(cfg.read_text()) == user   # original untouched
    written = json.loads(out.read_text())
    assert written["zero_optimization"] == user["zero_optimization"]          # nvme_path /mine, stage 3, as given
    # the user's num_threads is kept as written (`iotune lint` says DeepSpeed ignores it); no use_gds added
    assert written["aio"] == {"num_threads": 4, **{k: v for k, v in frag["aio"].items() if k != "use_gds"}}
    cfg.write_text("{ bad")
    with pytest.raises(UsageError, match=r"is not valid JSON \(line 1, column 3\)"):
        apply_to_config(cfg, {"aio.queue_depth": 16}, in_place=False)


@needs_root
def test_sweep_refuses_a_directory_without_o_direct(tmp_path: Path) -> None:
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "none", str(mnt)], check=True)
    try:
        r = CliRunner().invoke(cli, ["sweep", "--path", str(mnt), "-o", str(tmp_path / "j")])
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    assert r.exit_code == 2
    assert r.stderr == (f"Error: --path {mnt}: the filesystem does not support O_DIRECT; DeepSpeed swaps "
                        f"with O_DIRECT, so sweep a directory on ext4, xfs or btrfs on the drive you will use\n")


def test_sweep_bad_override() -> None:
    r = CliRunner().invoke(cli, ["sweep", "--queue-depths", "4,zero"])
    assert r.exit_code == 2 and "Invalid value for '--queue-depths'" in r.stderr
