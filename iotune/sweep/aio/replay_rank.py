"""Stage 4a of an aio sweep, rank on the replay: the finalists ranked on the
replay of the job's own swap I/O (iotune.sweep.replay) instead of on real
steps, which at the sizes users train vary by 9-14 % from run to run and
take minutes each.

1. The recording run: the first training-step trial at DeepSpeed's defaults
   runs with iotune's startup hook, and the swap schedule of one of its
   steady steps is kept whole in the trial's raw record (journaled as a
   trial of the training-step executor at the defaults with repeat
   TRACE_REPEAT, outside every pair), so a resumed sweep replays the same.
2. The fidelity check: the schedule replayed at the defaults with the
   job's compute (FIDELITY_REPEATS replays in one child, their median), on
   the same target, against the traced step (model.replay_result.Fidelity).
   Within its tolerance the replay ranks; otherwise the reason is the
   fallback and the finalists run on real steps as without a replay.
3. The pairs: each finalist against the defaults in ABBA pairs decided by
   the confirmation rule (sweep.replay_pairs, shared with the offload
   search), at most `replay_pairs` each, each schedule as DeepSpeed swaps
   it at the point's block size (SwapSchedule.swapped_at: a block size
   above 1 MiB keeps the tensors under it in RAM).

The replay's pick is the finalist the rule finds faster than the defaults
(the fastest such); only it then runs real steps (confirm.confirm_on_steps),
and only the real steps can make it the recommendation.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...model.aio import AioSettings
from ...model.budget_fit import FIRST_LOOK_PAIRS
from ...model.aio_replay import NOT_RANKED, RecordedSchedule, ReplayRanking, ReplayRow
from ...model.replay import ScheduleError, SwapSchedule
from ...model.replay_result import Fidelity
from ...model.sweep import Measurement, SweepPoint
from ...model.sweep_result import Progress
from ..executor import Executor, Target
from ..journal import Journal
from ..measure import Measurer
from ..replay import ReplayError
from ..replay_pairs import PairReplays, replay_batch, replay_pairs
from ..sequential import SequentialRule
from .budget import AioBudget

TRACE_REPEAT = -1            # the recording run's repeat index: outside the pairs, which count from 0
FIDELITY_REPEATS = 3         # replays in the fidelity check (their median is compared with the traced step)
FIDELITY_KEY = "aio-fidelity"     # the journal key of the fidelity check's replays
PAIRS_KEY = "aio-replay "         # + a finalist's key: the journal key of its replay pairs

Say = Callable[[str], None]


@dataclass(frozen=True)
class Stage:
    """Where the stage runs and reports."""

    target: Target
    journal: Journal
    on_trial: Callable[[Progress], None] | None = None
    say: Say = lambda s: None
    budget: AioBudget | None = None       # --budget (None: no budget, as in tests of one stage)


class RecordingRun:
    """The training-step executor's run that keeps the swap schedule of a steady step in its raw
    record (same journal name, so a resumed sweep finds the trial)."""

    def __init__(self, steps: Executor) -> None:
        self.steps, self.name = steps, steps.name

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        return self.steps.run(point, target, record_schedule=True)     # type: ignore[call-arg]


def can_record(steps: Executor) -> bool:
    """The executor can run with the startup hook and keep the swap schedule (run(..., record_schedule))."""
    return "record_schedule" in inspect.signature(steps.run).parameters


def recorded_schedule(default: SweepPoint, steps: Executor, stage: Stage) -> tuple[SwapSchedule | None, str]:
    """(schedule, "") from the recording run at the defaults (run now, or the journal's), or
    (None, why not, ending in NOT_RANKED)."""
    stage.say("recording your job's swap I/O: one training-step trial at DeepSpeed's defaults with iotune's startup "
              "hook; the swap schedule of a steady step is journaled and replayed to rank the candidates")
    trial = Measurer(RecordingRun(steps), stage.target, stage.journal, stage.on_trial, 1).measure(
        default, TRACE_REPEAT)
    if stage.budget is not None:
        stage.budget.timed(trial.seconds, "the recording run")
    if trial.status != "ok":
        return None, f"the run at DeepSpeed's defaults failed ({trial.error}), {NOT_RANKED}"
    ranks = trial.raw.get("ranks") or []
    if len(ranks) > 1:
        return None, (f"your job ran {len(ranks)} ranks, and the replay replays one rank's swap I/O, not theirs "
                      f"together on the drive, {NOT_RANKED}")
    found = trial.raw.get("schedule")
    if not isinstance(found, dict):
        why = trial.raw.get("schedule_error") or "the trial recorded none"
        return None, f"no swap schedule from the run at DeepSpeed's defaults ({why}), {NOT_RANKED}"
    try:
        return SwapSchedule.from_json(found), ""
    except (ScheduleError, ValueError, KeyError, TypeError) as e:
        return None, f"the journal's swap schedule does not load ({e}): run the sweep with --fresh; {NOT_RANKED}"


def defaults_entry(schedule: SwapSchedule, default: SweepPoint) -> tuple[SwapSchedule, AioSettings]:
    """The schedule as DeepSpeed swaps it at the defaults, with their aio settings: the fidelity
    check's replay, and the reference of every finalist's pairs."""
    return schedule.swapped_at(default.block_size), default.aio()


def check_fidelity(schedule: SwapSchedule, entry: tuple[SwapSchedule, AioSettings],
                   stage: Stage) -> tuple[Fidelity | None, str]:
    """(fidelity, "") of the replay of `entry` (defaults_entry) against the traced step, or (None,
    why) when the replay could not run; the caller falls back unless fidelity.can_rank."""
    try:
        batch = replay_batch(stage.journal, stage.target, FIDELITY_KEY, 0, [entry], (0,) * FIDELITY_REPEATS)
    except ReplayError as e:
        return None, f"the replay of your job's swap I/O could not run ({e}), {NOT_RANKED}"
    return Fidelity(statistics.median(batch.seconds), schedule.traced_s), ""


def replay_finalist(candidate: SweepPoint, defaults: tuple[SwapSchedule, AioSettings], schedule: SwapSchedule,
                    rule: SequentialRule, stage: Stage) -> PairReplays | str:
    """The finalist's replay pairs against the defaults (defaults_entry), or why it has none."""
    mine = schedule.swapped_at(candidate.block_size)
    if not mine.groups:
        return (f"at block_size {candidate.block_size} DeepSpeed swaps none of this job's tensors (each is under "
                f"max(1 MiB, block_size), so all stay in RAM): nothing to replay, and not an aio setting for this "
                f"job's offload")
    fits = stage.budget.replay_fits if stage.budget is not None else (lambda pairs: True)
    try:
        got = replay_pairs(stage.journal, stage.target, PAIRS_KEY + candidate.key(), defaults,
                           (mine, candidate.aio()), rule, fits)
    except ReplayError as e:
        return f"its replay failed ({e})"
    if got is None and stage.budget is not None and stage.budget.clock.stopped:
        stage.budget.unranked(candidate.label())
        return "the budget left no time for its replays"
    return got if got is not None else "no replay pair ran"


def rank_on_replay(candidates: list[SweepPoint], default: SweepPoint, steps: Executor, rule: SequentialRule,
                   stage: Stage) -> ReplayRanking:
    """The replay stage (module docstring): the ranking and the pick, or the fallback and why."""
    schedule, why = recorded_schedule(default, steps, stage)
    if schedule is None:
        return ReplayRanking(fallback=why, max_pairs=rule.max_pairs)
    rec = RecordedSchedule.of(schedule)
    defaults = defaults_entry(schedule, default)
    fid, why = check_fidelity(schedule, defaults, stage)
    if fid is None or not fid.can_rank:
        return ReplayRanking(rec, fid, fallback=why or ReplayRanking(rec, fid).fidelity_line(),
                             max_pairs=rule.max_pairs)
    stage.say(f"replay: {ReplayRanking(rec, fid).fidelity_line()} ({rec.describe()})")
    if stage.budget is not None:
        stage.budget.make_plan(len(candidates), first_look_s(stage.journal), 1)
    stage.say(f"ranking {len(candidates)} candidate(s) on the replay of your job's swap I/O against DeepSpeed's "
              f"defaults, in pairs of alternating order until the confirmation rule decides (at most "
              f"{rule.max_pairs} each)")
    replayed: dict[str, PairReplays] = {}
    failed: list[str] = []
    for i, c in enumerate(candidates):
        if stage.budget is not None and not stage.budget.replay_planned(i) and \
                stage.journal.find_replay(PAIRS_KEY + c.key(), 0) is None:
            stage.budget.unranked(c.label())
            got: PairReplays | str = f"the budget's plan holds the replays of {i} finalist(s) only"
        else:
            got = replay_finalist(c, defaults, schedule, rule, stage)
        if isinstance(got, str):
            failed.append(got)
            stage.say(f"replayed {c.label()}: {got}, left unranked")
            continue
        replayed[c.key()] = got
        d = got.decision
        stage.say(f"replayed {c.label()}: median {statistics.median(got.seconds):.3f} s over {len(got.seconds)}, "
                  f"{d.center:.2f}x the defaults' speed: {d.verdict}")
    if not replayed:
        return ReplayRanking(rec, fid, fallback=f"no replay pair could be measured ({failed[0]}), {NOT_RANKED}",
                             max_pairs=rule.max_pairs)
    rows = replay_rows(candidates, default, replayed)
    faster = [r for r in rows if r.verdict == "faster"]
    pick = max(faster, key=lambda r: (r.ratio, r.point.key())).point if faster else None
    return ReplayRanking(rec, fid, tuple(rows), pick, max_pairs=rule.max_pairs)


def first_look_s(journal: Journal) -> float:
    """A finalist's first look on replays (FIRST_LOOK_PAIRS pairs in one child), at the
    fidelity check's measured cost: its child's wall time, start-up included, per replay."""
    batch = journal.find_replay(FIDELITY_KEY, 0)
    return batch.wall_s * 2 * FIRST_LOOK_PAIRS / FIDELITY_REPEATS if batch is not None else 0.0


def _row(point: SweepPoint, seconds: Sequence[float], **decided: Any) -> ReplayRow:
    med = statistics.median(seconds)
    return ReplayRow(point, med, (max(seconds) - min(seconds)) / med if med > 0 else 0.0, len(seconds), **decided)


def replay_rows(candidates: list[SweepPoint], default: SweepPoint,
                replayed: dict[str, PairReplays]) -> list[ReplayRow]:
    """Each replayed finalist's row and the defaults' (their replays in every finalist's pairs), fastest
    first."""
    rows = [_row(default, [s for r in replayed.values() for s in r.reference_seconds])]
    for c in candidates:
        got = replayed.get(c.key())
        if got is not None:
            d = got.decision
            rows.append(_row(c, got.seconds, ratio=d.center, lower=d.lower,
                             upper=d.upper if math.isfinite(d.upper) else 0.0, pairs=d.pairs, verdict=d.verdict))
    return sorted(rows, key=lambda r: (r.seconds, r.point.key()))
