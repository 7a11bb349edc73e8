"""The offload search's replay ranking against real steps, at CI scale: the
built-in tiny model with its optimizer on NVMe, on the latency-bound test bed
(40 ms per request, 64 at once: DeepSpeed's aio keeps queue_depth requests
of block_size in flight per file, so a small swap file takes as long per
request as a large one, and how sub_group_size cuts the optimizer's state
decides the step's I/O time).

The job's own config cuts its 3.7 M parameters at sub_group_size 922176
(4 sub-groups); the search's other sub_group_sizes are 461088 (7 sub-groups,
slower), 1844352 (2) and 1e9 (1). The search ranks the three on replays of
schedules derived from the reference trial's steady step and sends the
fastest to one real-step pair; real steps of the other candidates are run
here on the same bed, and the replay's order must be theirs. On a machine
so loaded that the drive runs slower than when the step was traced, the
fidelity gate shuts and every candidate runs real steps (the search's
fallback, checked); the ranking is then made here from the search's journal,
and compared with those real steps. Then the same search, resumed with a
budget of one second and room for more pairs, stops at the budget and says
what it could not decide.

The comparison is with the real optimizer step (the part of the step the
replay stands for; the forward and backward are the same for every
candidate and only add the shared machine's noise), and replays are
compared as ratios to your config's replays in the same pairs.

Measured here (2026-11-28, 2 cores shared at a load average of 9-10), two
runs. The gate shut (the traced step replayed at 1.07 of its time):
replays of 1e9, 1844352 and 461088 took 0.59, 0.60 and 1.63 of your
config's; real optimizer steps 0.70, 0.76 and 2.10 s against its 1.25 s
(0.56, 0.61, 1.68); Spearman 1.0; 7 min 44 s. The gate open (1.03):
0.59, 0.60, 1.60 against 0.56, 0.61, 1.63; Spearman 1.0; 6 min 25 s.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.budget import SearchClock
from iotune.sweep.offload.replay_rank import Replays, rank_all, split
from iotune.sweep.offload.runner import BuiltinRunner, TrialPlan
from iotune.sweep.offload.changes import apply_changes
from iotune.volumes.beds import running_bed
from iotune.workloads.presets import PRESETS, tensor_numels
from iotune.workloads.strategies import WorkloadSpec, ds_config
from tests.conftest import needs_deepspeed, needs_root_for

from tests.project.test_schemas import conforms

pytestmark = [needs_deepspeed, needs_root_for("the latency-bound test bed (a FUSE drive, losetup, mkfs)")]

SUB_GROUP = "zero_optimization.sub_group_size"
OWN = 922_176
OTHERS = (461_088, 1_844_352, 1_000_000_000)
TINY = JobShape(tuple(tensor_numels(PRESETS["tiny"])))
FIXES = ["--fix", "zero_optimization.offload_optimizer.device=nvme", "--fix",
         "zero_optimization.offload_param.device=none", "--fix",
         "zero_optimization.offload_optimizer.pipeline_read=false", "--fix",
         "zero_optimization.offload_optimizer.pipeline_write=false"]


@dataclass(frozen=True)
class Searched:
    bed: Path
    work: Path
    cfg: dict[str, Any]
    argv: list[str]
    doc: dict[str, Any]
    stderr: str
    ranked: tuple[dict[str, Any], ...]      # the replay ranking: the search's, or (its fidelity gate shut) run here


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Searched]:
    work = tmp_path_factory.mktemp("offload-replay")
    with running_bed("latency-bound") as bed:
        cfg = ds_config(WorkloadSpec(strategy="nvme-opt", size="tiny", nvme_path=str(bed.path)))
        cfg["zero_optimization"]["sub_group_size"] = OWN
        (work / "ds.json").write_text(json.dumps(cfg))
        argv = ["sweep", "offload", "--model", "tiny", "--ds-config", str(work / "ds.json"), "--path", str(bed.path),
                *FIXES, "-o", str(work / "journal"), "--json"]
        r = CliRunner().invoke(cli, [*argv, "--max-pairs", "1"])
        assert r.exit_code == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        ranked = tuple(doc["replay"]["ranked"]) or rank_here(work, cfg, bed.path)
        yield Searched(bed.path, work, cfg, argv, doc, r.stderr, ranked)


def rank_here(work: Path, cfg: dict[str, Any], drive: Path) -> tuple[dict[str, Any], ...]:
    """The replay ranking the search would have made, from its journal (its reference's steady
    step), when the fidelity gate kept it from ranking (a machine loaded enough that the drive
    ran slower than when the step was traced)."""
    journal = Journal(work / "journal" / "journal.jsonl")
    [(_, base)] = journal.replay_bases
    own = OffloadKnobs.from_ds_config(cfg)
    rp = Replays(base, own, TINY, cfg, Target(drive), journal, print)
    derived, refused = split(rp, [(json.dumps({SUB_GROUP: v}), replace(own, sub_group_size=v)) for v in OTHERS])
    assert refused == []
    ranked, left = rank_all(rp, [(k, json.loads(k), knobs, s) for k, knobs, s in derived], SearchClock(), 0.0)
    assert left == []
    return tuple(r.to_json() for r in ranked)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of two lists without ties."""
    def ranks(xs: list[float]) -> list[int]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        return [order.index(i) for i in range(len(xs))]
    ra, rb, n = ranks(a), ranks(b), len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def real_optimizer_s(s: Searched, changes: dict[str, Any]) -> float:
    """The median optimizer step of `changes`' real-step trials (the part of the step the replay
    stands for): the search's, else one trial run now on the same bed."""
    mine = [t["optimizer_step_s"] for t in s.doc["trials"] if t["changes"] == changes and t["status"] == "ok"]
    if mine:
        return statistics.median(mine)
    work = s.bed / f"truth-{changes.get(SUB_GROUP)}"
    (work / "swap").mkdir(parents=True)
    r = BuiltinRunner("tiny").run(apply_changes(s.cfg, changes, str(work / "swap")), work, None, TrialPlan())
    assert r.status == "ok", r.error
    return r.optimizer_step_s


def test_the_replay_ranks_sub_group_sizes_as_real_steps_do(searched: Searched) -> None:
    doc = searched.doc
    conforms("sweep-offload-3", doc)
    replay = doc["replay"]
    if replay["can_rank"]:       # ranked on replays: no candidate ran a real-step trial, the pick went to the pairs
        assert abs(replay["traced_ratio"] - 1) <= 0.05 and abs(replay["derived_ratio"] - 1) <= 0.05
        assert [t["role"] for t in doc["trials"]] == ["reference", "pair-candidate", "pair-base"]
        assert doc["picked_by"] == "replay" and json.dumps(doc["picked"]) == replay["pick"]
        assert doc["plan"]["replay_candidates"] == 3 and doc["plan"]["real_trials"] == 0
        assert searched.stderr.index("offload: plan within") < searched.stderr.index("offload: replayed ")
    else:                        # the gate shut: every candidate ran real steps, and the report says why
        assert "so the replay does not reproduce this job; every candidate runs real steps" in replay["fidelity"]
        assert sorted(t["changes"][SUB_GROUP] for t in doc["trials"] if t["role"] == "search") == sorted(OTHERS)
    ranked = {r["changes"][SUB_GROUP]: r for r in searched.ranked}
    assert set(ranked) == set(OTHERS)
    assert all(len(r["seconds"]) >= 3 and len(r["seconds"]) == len(r["reference_seconds"]) for r in ranked.values())
    assert ranked[461_088]["verdict"] == "slower"            # 7 sub-groups: twice the requests of your 4
    # each size's replays against your config's in the same pairs (drift cancels), against real optimizer steps
    replay_rel = {OWN: 1.0, **{k: 1 / r["ratio"] for k, r in ranked.items()}}
    real_s = {k: real_optimizer_s(searched, {} if k == OWN else {SUB_GROUP: k}) for k in replay_rel}
    keys = sorted(replay_rel)
    rho = spearman([replay_rel[k] for k in keys], [real_s[k] for k in keys])
    print(f"\nreplay / your config's {replay_rel}\nreal optimizer step s {real_s}\nSpearman {rho:.2f}")
    for a in keys:              # the orders agree wherever the replays tell two sizes apart by more than 15 %
        for b in keys:
            if replay_rel[a] < replay_rel[b] / 1.15:
                assert real_s[a] < real_s[b], (a, b, replay_rel, real_s)
    assert rho >= 0.8, (replay_rel, real_s)
    assert doc["plan"]["budget_source"].startswith("the default: 24 x the reference trial's")


def test_a_budget_stops_the_search_and_says_what_it_could_not_decide(searched: Searched) -> None:
    """Resumed with --max-pairs 3 and a second's budget: the journal holds the reference,
    the replays and the first pair (free); the second pair does not fit."""
    r = CliRunner().invoke(cli, [*searched.argv, "--max-pairs", "3", "--budget", "1s"])
    assert r.exit_code == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    conforms("sweep-offload-3", doc)
    assert doc["trials_run_now"] == 0 and doc["stopped"] == "budget" and doc["verdict"] == "undecided"
    assert doc["plan"]["budget_s"] == 1.0 and doc["plan"]["budget_source"] == "--budget 1 s"
    assert doc["plan"]["max_pairs"] == 0 and doc["plan"]["replay_candidates"] == len(doc["replay"]["ranked"])
    name = f"sub_group_size={doc['picked'][SUB_GROUP]}"
    [line] = doc["undecided"]
    assert line.startswith(f"undecided: {name} vs your config: at least 2 more pairs (≈ "), line
    assert "offload: plan within 1 s (--budget 1 s)" in r.stderr
    assert "cut to fit the budget: at most 0 confirmation pair(s), not 3" in r.stderr
    text = CliRunner().invoke(cli, [*searched.argv[:-1], "--max-pairs", "3", "--budget", "1s"])
    assert "the budget stopped the search:" in text.stdout and line in text.stdout
    assert "would settle it (--budget)" in text.stdout
