"""Sweeps on real devices: disk full, DeepSpeed validation, training-step trials."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.steps import StepProgress
from iotune.model.sweep import SweepPoint
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.aio.recommend import ds_fragment, validate_with_deepspeed
from iotune.sweep.sequential import SequentialRule, decide
from iotune.sweep.aio.steps_executor import StepsExecutor

from tests.conftest import ext4_mount, make_loops, needs_deepspeed, needs_fio, needs_root



@pytest.fixture
def small_fs(tmp_path: Path):
    """A 32 MiB ext4 filesystem on a loop device: fills up quickly."""
    with ext4_mount(tmp_path, 32 << 20) as mnt:
        yield mnt


@needs_root
@needs_fio
def test_disk_full_fails_the_trial_and_keeps_the_journal(small_fs: Path, tmp_path: Path) -> None:
    out = tmp_path / "journal"
    r = CliRunner().invoke(cli, ["sweep", "--path", str(small_fs), "--profile", "quick", "--block-sizes", "1M",
                                 "--queue-depths", "4", "--aio-threads", "1", "--file-bytes", "16M",
                                 "--confirm", "0", "-o", str(out), "--json"])
    assert r.exit_code == 1, r.output        # 3 x 16 MiB cannot fit in 32 MiB: nothing measurable
    trials = Journal(out / "journal.jsonl").trials
    assert trials and all(t.status == "failed" for t in trials)
    assert "No space left on device" in trials[0].error or "ENOSPC" in trials[0].error, trials[0].error
    doc = json.loads(r.stdout)
    assert doc["recommended"] is None and doc["failed"] == len(trials)


def test_nonexistent_path_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["sweep", "--path", str(tmp_path / "nope")])
    assert r.exit_code == 2
    assert r.stderr == f"Error: --path {tmp_path / 'nope'} is not a directory: create it on the drive to tune\n"


@needs_root
def test_a_read_only_path_is_refused_with_why_and_nothing_made(tmp_path: Path) -> None:
    """The sweep's own directory for its trials' files cannot be made there
    either: the path's check says why, not a traceback."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        r = CliRunner().invoke(cli, ["sweep", "--path", str(ro), "--profile", "quick", "-o", str(tmp_path / "j")])
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"Error: --path {ro}: cannot create a file there: Read-only file system; DeepSpeed swaps "
                        f"with O_DIRECT, so sweep a directory on ext4, xfs or btrfs on the drive you will use\n")
    assert list(src.iterdir()) == []


@needs_deepspeed
def test_deepspeed_accepts_the_fragment_and_rejects_string_booleans() -> None:
    frag = ds_fragment(SweepPoint(block_size=512 << 10, queue_depth=16, intra_op_parallelism=2), "/x")
    assert validate_with_deepspeed(frag) is None
    frag["aio"]["single_submit"] = "false"          # what ds_nvme_tune prints
    assert "incompatible constructor arguments" in (validate_with_deepspeed(frag) or "")


@needs_root
@needs_deepspeed
def test_a_steps_trial_runs_with_the_recommended_settings(tmp_path: Path) -> None:
    [loop] = make_loops(tmp_path, 1, 512 << 20)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
    subprocess.run(["mount", loop, str(mnt)], check=True)
    ex = StepsExecutor(steps=3)
    told: list[StepProgress] = []
    try:
        m, raw = ex.run(SweepPoint(block_size=512 << 10, queue_depth=16, omp_threads=1),
                        Target(mnt, on_step=told.append))
    finally:
        ex.close()
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", loop], check=False)
    assert len(raw["steps"]) == 3 and m.step_s > 0 and 0 < m.optimizer_step_s < m.step_s
    assert [s["omp_threads"] for s in raw["steps"]] == [1, 1, 1]       # the optimizer ran with what was asked
    assert ex.notes == []                                               # started warm
    # a progress display was told the run started, then each step as the workload logged it
    assert told == [StepProgress(0, 3)] + [StepProgress(s["step"], 3, s["step_s"], s["loss"]) for s in raw["steps"]]


@needs_root
@needs_fio
@needs_deepspeed
def test_real_steps_decide_in_alternating_pairs_against_the_defaults(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--confirm 1 on the built-in emulated drive, at most 2 pairs of 3
    steps: the executor's best and DeepSpeed's defaults run back to back on
    real training steps, the candidate first in pair 0 and the defaults
    first in pair 1, each trial journaled with its order; two pairs are
    fewer than the rule's first look (3), so the outcome carries the paired
    ratios, no interval yet and the pairs the rule would need, and keeps
    the defaults. (DeepSpeed's check of the fragment has its own test above;
    replay_pairs 0: the finalist goes to real steps directly, the ranking on
    the replay is tests/sweep/test_aio_replay.py's.)"""
    from tests.volumes.test_emulated_drive import _FUSE_MISSING

    if _FUSE_MISSING:
        pytest.skip(_FUSE_MISSING)
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    (tmp_path / "p.toml").write_text(
        '[space]\nblock_size = ["256K", "1M"]\nqueue_depth = [8]\nintra_op_parallelism = [1]\n'
        'single_submit = [false]\noverlap_events = [true]\n'
        '[run]\nsearch = "grid"\nrepeats = 1\nfile_bytes = "4M"\nsteps = 3\nconfirm_pairs = 2\nreplay_pairs = 0\n'
        'runtime_s = 1.0\nramp_s = 0.25\n')
    out = tmp_path / "j"
    r = CliRunner().invoke(cli, ["sweep", "--profile", str(tmp_path / "p.toml"), "--confirm", "1", "-o", str(out),
                                 "--json"])
    assert r.exit_code == 0, r.stderr[-3000:]
    assert ("confirming 1 candidate(s) against DeepSpeed's defaults with 3 training steps each, in pairs of "
            "alternating order until the confirmation rule decides (at most 2 each, fewer than the 3 it decides "
            "from: it will say how many more it needs)\n") in r.stderr
    doc = json.loads(r.stdout)
    default = SweepPoint(block_size=1 << 20, queue_depth=8)          # DeepSpeed's aio defaults
    candidate = SweepPoint(block_size=256 << 10, queue_depth=8)
    steps = [t for t in Journal(out / "journal.jsonl").trials if t.executor == "steps"]
    assert [(t.point, t.repeat) for t in steps] == [(candidate, 0), (default, 0), (default, 1), (candidate, 1)]
    assert [t.pair_order for t in steps] == ["candidate-first"] * 2 + ["reference-first"] * 2
    assert all(t.status == "ok" and len(t.raw["steps"]) == 3 for t in steps), [t.error for t in steps]
    opt = [t.measurement.optimizer_step_s for t in steps]
    gain = doc["step_gain"]
    assert gain["candidate"] == candidate.to_json() and gain["pairs"] == 2
    assert gain["ratios"] == pytest.approx([opt[1] / opt[0], opt[2] / opt[3]])
    assert gain["min"] <= gain["median"] <= gain["max"] and gain["min"] <= gain["center"] <= gain["max"]
    decided = decide(gain["ratios"], SequentialRule(noise_floor=0.05, max_pairs=2))     # the same rule, by hand
    assert (gain["verdict"], gain["more_pairs"]) == (decided.verdict, decided.more_pairs_needed) and \
        decided.verdict == "undecided" and gain["more_pairs"] >= 1
    assert (gain["lower"], gain["upper"], gain["noisy"]) == (0.0, 0.0, True)       # 2 pairs resolve nothing
    assert (gain["floor"], gain["max_pairs"]) == (0.05, 2)
    assert doc["recommended"] == default.to_json() and "undecided on real steps" in gain["sentence"]
    assert {c["key"] for c in doc["confirmed"]} == {candidate.key(), default.key()}
    for c in doc["confirmed"]:
        assert c["executor"] == "steps" and len(c["scores"]) == 2 and 0 < c["optimizer_step_s"] < c["step_s"]
    assert doc["fragment"]["aio"]["block_size"] == doc["recommended"]["block_size"]
