"""`iotune sweep` through the CLI, for what the README promises: --grid,
--fresh, --export, --export-jobs, --apply / --in-place, and a journal
recorded with other settings refused. fio trials on a tmp directory (ext4
takes O_DIRECT), tiny files; DeepSpeed's validation of the fragment has its
own test (test_sweep_e2e.py) and is stubbed here to keep these fast."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import needs_fio
from click.testing import CliRunner, Result

from iotune.cli import cli
from iotune.model.sweep import SweepPoint
from iotune.sweep.fio_executor import parse_fio_json
from iotune.sweep.journal import Journal
from iotune.workloads.fastops import ops_to_build

pytestmark = needs_fio

BLOCKS, DEPTHS = (64 << 10, 256 << 10), (1, 4)
PROFILE = ('[space]\nblock_size = ["64K", "256K"]\nqueue_depth = [1, 4]\nintra_op_parallelism = [1]\n'
           'single_submit = [false]\noverlap_events = [true]\n'
           '[run]\nrepeats = 1\nfinalists = 1\nconfirm_top = 0\nfile_bytes = "1M"\nfiles = 2\n')
GRID = {SweepPoint(block_size=b, queue_depth=q).key() for b, q in itertools.product(BLOCKS, DEPTHS)}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))    # no DeepSpeed op is loaded here
    (tmp_path / "p.toml").write_text(PROFILE)
    (tmp_path / "drive").mkdir()
    return tmp_path


def sweep(work: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["sweep", "--path", str(work / "drive"), "--profile", str(work / "p.toml"),
                                    "-o", str(work / "j"), "--json", *args])


def ok(r: Result) -> dict:
    assert r.exit_code == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_grid_measures_every_combination_once_per_repeat(work: Path) -> None:
    r = sweep(work, "--grid", "--repeats", "2")
    doc = ok(r)
    # DeepSpeed's check of the pick loads async_io: with nothing built, the sweep says it will build first;
    # ops prebuilt into DeepSpeed (scripts/setup.sh) build nothing, and it says nothing
    unbuilt = ops_to_build()
    if unbuilt:
        assert f"DeepSpeed's {' and '.join(unbuilt)} op" in r.stderr and "not built for this install yet" in r.stderr
    else:
        assert "not built for this install yet" not in r.stderr
    trials = Journal(work / "j" / "journal.jsonl").trials
    assert sorted((t.point.key(), t.repeat) for t in trials) == sorted(itertools.product(GRID, (0, 1)))
    assert doc["trials"] == doc["trials_run_now"] == 8 and doc["failed"] == 0
    assert {r["key"] for r in doc["ranking"]} == GRID and all(len(r["scores"]) == 2 for r in doc["ranking"])
    assert list((work / "drive").iterdir()) == []          # every trial removed its files


def test_fresh_keeps_the_old_journal_under_a_new_name(work: Path) -> None:
    ok(sweep(work, "--grid"))
    journal = work / "j" / "journal.jsonl"
    first = journal.read_text()
    assert ok(sweep(work, "--grid"))["trials_run_now"] == 0          # resumed: nothing to run
    doc = ok(sweep(work, "--grid", "--fresh"))
    assert doc["trials_run_now"] == 4 and doc["trials"] == 4
    [kept] = [p for p in (work / "j").iterdir() if p != journal]
    assert kept.name.startswith("journal.") and kept.suffix == ".jsonl" and kept.read_text() == first
    assert journal.read_text() != first


def test_a_journal_recorded_with_other_settings_starts_a_new_one_and_keeps_the_old(work: Path) -> None:
    ok(sweep(work, "--grid"))
    journal = work / "j" / "journal.jsonl"
    first = journal.read_text()
    r = sweep(work, "--grid", "--file-bytes", "2M")
    assert ok(r)["trials_run_now"] == 4                                  # nothing of the old settings reused
    [kept] = [p for p in (work / "j").iterdir() if p != journal]
    assert kept.read_text() == first
    assert (f"sweep: the journal in {work / 'j'} was recorded with file_bytes 1048576, not 2097152: starting a new "
            f"one (the old one is kept as {kept.name})") in r.stderr


def test_a_damaged_journal_is_refused_with_its_line(work: Path) -> None:
    ok(sweep(work, "--grid"))
    journal = work / "j" / "journal.jsonl"
    with journal.open("a") as fh:
        fh.write('{"kind": "trial", "executor": "fio"}\n')
    r = sweep(work, "--grid")
    assert r.exit_code == 2
    assert r.stderr == (f"Error: {journal}:6: not a trial record (KeyError: 'point'); the sweep journal is damaged: "
                        "fix or delete that line to resume, or start a new journal with --fresh (the old one is "
                        "kept) or another --out\n")


def test_export_csv_has_one_row_per_trial(work: Path) -> None:
    import pandas as pd

    doc = ok(sweep(work, "--grid", "--export", str(work / "t.csv")))
    df = pd.read_csv(work / "t.csv")
    assert len(df) == doc["trials"] == 4 and set(df["key"]) == GRID
    by_key = {r["key"]: r for r in doc["ranking"]}
    for row in df.itertuples():
        assert row.score == pytest.approx(by_key[row.key]["median"], rel=1e-9)
        assert row.block_size in BLOCKS and row.queue_depth in DEPTHS and row.status == "ok"


def test_export_parquet_or_a_clear_error_before_sweeping(work: Path) -> None:
    dest = work / "t.parquet"
    r = sweep(work, "--grid", "--export", str(dest))
    if any(importlib.util.find_spec(m) for m in ("pyarrow", "fastparquet")):
        import pandas as pd

        assert r.exit_code == 0, r.stderr[-2000:]
        assert set(pd.read_parquet(dest)["key"]) == GRID
    else:
        assert r.exit_code == 2
        assert r.stderr == "Error: Parquet export needs pyarrow (pip install pyarrow); or export to .csv\n"
        assert not (work / "j").exists()                 # refused before any trial ran
    r = sweep(work, "--export", str(work / "t.txt"))
    assert r.exit_code == 2 and r.stderr == f"Error: --export {work / 't.txt'}: use a .csv or .parquet file name\n"


def test_export_jobs_writes_job_files_that_fio_runs(work: Path) -> None:
    jobs = work / "jobs"
    doc = ok(sweep(work, "--grid", "--export-jobs", str(jobs)))
    assert sorted(p.name for p in jobs.iterdir()) == sorted(f"{k}.fio" for k in GRID)
    best = doc["ranking"][0]["key"]
    out = subprocess.run(["fio", "--output-format=json", str(jobs / f"{best}.fio")], capture_output=True,
                         text=True, check=True)
    doc_fio = json.loads(out.stdout[out.stdout.index("{"):])
    swap_in = next(j for j in doc_fio["jobs"] if j["jobname"] == "swap-in")
    assert swap_in["read"]["io_bytes"] == 2 * (1 << 20)          # files x file_bytes, read back
    assert parse_fio_json(doc_fio).write_bytes_per_s > 0
    assert list((work / "drive").iterdir()) == []               # the job file unlinks its files too


def test_apply_writes_beside_the_config_and_in_place_over_it(work: Path) -> None:
    user = {"train_batch_size": 8, "aio": {"num_threads": 4, "thread_count": 2, "queue_depth": 64},
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/mine"}}}
    cfg = work / "ds_config.json"
    cfg.write_text(json.dumps(user))
    r = sweep(work, "--grid", "--apply", str(cfg))
    assert r.exit_code == 2 and "--apply" in r.stderr and not (work / "ds_config.iotune.json").exists()
    r = sweep(work, "--grid", "--model", "tiny", "--apply", str(cfg))        # the built-in model, named on purpose
    doc = ok(r)
    beside = work / "ds_config.iotune.json"
    assert f"wrote {beside}\n" in r.stderr and json.loads(cfg.read_text()) == user     # original untouched
    applied = json.loads(beside.read_text())
    # only the aio keys the sweep decided change: the user's num_threads and thread_count stay as written
    # (`iotune lint` says DeepSpeed ignores them), no use_gds is added, the offload block is the user's
    tuned = {k: v for k, v in doc["fragment"]["aio"].items() if k != "use_gds"}
    assert applied["aio"] == {"num_threads": 4, "thread_count": 2, **tuned}
    assert list(applied["aio"])[:3] == ["num_threads", "thread_count", "queue_depth"]       # the user's order
    assert doc["dropped_aio_keys"] == [] and doc["applied_to"] == str(beside)
    assert applied["zero_optimization"] == user["zero_optimization"] and applied["train_batch_size"] == 8
    # the diff on stderr, after `wrote`: the user's file against the one written
    assert f"wrote {beside}\n--- {cfg}\n+++ {beside}\n" in r.stderr
    assert f"\n-{json.dumps(user)}\n+{beside.read_text()}\n" in r.stderr        # its one line, edited in place
    beside.unlink()
    r = sweep(work, "--grid", "--model", "tiny", "--apply", str(cfg), "--in-place")
    assert ok(r)["fragment"] == doc["fragment"] and f"wrote {cfg}\n" in r.stderr
    assert json.loads(cfg.read_text()) == applied and not beside.exists()


def test_a_stale_op_build_lock_is_refused_before_any_trial(work: Path) -> None:
    """A build killed midway leaves torch's lock; every DeepSpeed op load (the fragment's check, aio and
    steps trials) would wait on it forever, so the sweep refuses to start and names the file to remove."""
    ext = work / "ext"                                    # the fixture's TORCH_EXTENSIONS_DIR
    (ext / "async_io").mkdir(parents=True)
    lock = ext / "async_io" / "lock"
    lock.touch()
    then = time.time() - 20 * 60
    os.utime(lock, (then, then))
    r = sweep(work)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"DeepSpeed op build lock {lock} is 20 min old and no build is running" in r.stderr
    assert f"Remove it (`rm {lock}`, or `iotune doctor --ds-config CONFIG --fix`)" in r.stderr
    assert not (work / "j").exists()                      # refused before the journal was opened
    os.utime(lock)                                        # a fresh lock may be a build starting: go ahead
    assert GRID <= {r["key"] for r in ok(sweep(work, "--grid"))["ranking"]}
