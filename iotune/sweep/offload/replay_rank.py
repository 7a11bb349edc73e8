"""The offload search's replay ranking: candidates that change only how the
optimizer's state is cut and moved (sub_group_size, the optimizer's
buffer_count, aio block_size and intra_op_parallelism) are ranked on replays
of their own swap schedules, derived from the reference trial's traced step
(iotune.model.offload_schedule), instead of on real steps.

    fidelity  the traced step and your config's derived schedule, replayed
              alternately (T D D T): each within 5 % of the traced time, or
              the replay ranks nothing and every candidate runs real steps
    rank      per candidate, one replayer child runs it and your config's
              derived schedule in ABBA pairs (3, then up to 6 while the
              sequential rule is undecided), each at its own aio setting;
              ranked by median replay seconds
    pick      the fastest the rule calls faster than your config goes to the
              real-step pairs (iotune.sweep.offload.confirm), as before

Every replayer child's seconds are journaled as it ends (ReplayBatch), and a
re-run takes them from the journal, as it does trials."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...model.aio import AioSettings
from ...model.offload import JobShape, OffloadKnobs
from ...model.offload_plan import FIRST_LOOK_PAIRS, ReplayBatch, ReplayRank
from ...model.offload_result import short_changes
from ...model.offload_schedule import ReplayBase, align_starts, derive_schedule, read_replay_base, replay_refusal
from ...model.replay import ScheduleError, SwapSchedule
from ...model.replay_result import FIDELITY_TOLERANCE
from ..executor import Target
from ..journal import Journal
from ..replay import ReplayError
from ..replay_pairs import replay_batch, replay_pairs
from ..sequential import REPLAY_MAX_PAIRS, SequentialRule
from ..budget import SearchClock
from .confirm import describe_decision
from .runner import RunResult, Runner, TrialPlan

FIDELITY_ORDER = (0, 1, 1, 0)  # the traced step's schedule (0) and your config's derived one (1)
SETTLE_S = 0.5                # the replayer idles this long before each replay (iotune.sweep.replayer)
FIDELITY = "fidelity"         # the journal key of the fidelity replays


class CapturingRunner:
    """A runner that keeps the steady step of the next trial it is armed for
    (the reference's): its events are gone once the trial's directory is."""

    def __init__(self, runner: Runner) -> None:
        self.runner, self.armed = runner, False
        self.base: ReplayBase | None = None
        self.error = ""

    @property
    def what(self) -> str:
        return self.runner.what

    @property
    def seq_len(self) -> int:
        return self.runner.seq_len

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, plan: TrialPlan) -> RunResult:
        r = self.runner.run(cfg, work, cgroup, plan)
        if self.armed and r.status == "ok":
            self.armed = False
            try:
                self.base = read_replay_base(work / "events")
            except ScheduleError as e:
                self.error = str(e)
        return r


def aio_of(cfg: dict[str, Any], knobs: OffloadKnobs) -> AioSettings:
    """The aio setting a candidate runs at: the config's aio block (what DeepSpeed reads of it;
    a value of the wrong type is DeepSpeed's default) with the candidate's block_size and
    intra_op_parallelism."""
    given = cfg.get("aio")
    block: dict[str, Any] = given if isinstance(given, dict) else {}
    d = AioSettings()
    qd, ss, oe = block.get("queue_depth"), block.get("single_submit"), block.get("overlap_events")
    return AioSettings(knobs.block_size, qd if isinstance(qd, int) and not isinstance(qd, bool) else d.queue_depth,
                       knobs.intra_op_parallelism, ss if isinstance(ss, bool) else d.single_submit,
                       oe if isinstance(oe, bool) else d.overlap_events)


@dataclass(frozen=True)
class Replays:
    """What the ranking works with: the reference's steady step and knobs, the job, the drive."""

    base: ReplayBase
    knobs: OffloadKnobs               # the reference's
    shape: JobShape
    cfg: dict[str, Any]
    target: Target
    journal: Journal
    say: Callable[[str], None]
    noise_floor: float = 0.05


def split(rp: Replays, candidates: Sequence[tuple[str, OffloadKnobs]]) -> tuple[list[tuple[str, OffloadKnobs,
                                                                                           SwapSchedule]],
                                                                                list[tuple[str, str]]]:
    """(the candidates a schedule is derived for, with it; (key, why) of those left to real steps)."""
    ok, rest = [], []
    for key, knobs in candidates:
        why = replay_refusal(rp.knobs, knobs)
        if not why:
            try:
                ok.append((key, knobs, derive_schedule(rp.base, rp.knobs, knobs, rp.shape)))
                continue
            except ScheduleError as e:
                why = str(e).removeprefix("not replayed: ")
        rest.append((key, why))
    return ok, rest


@dataclass(frozen=True)
class FidelityCheck:
    traced_ratio: float
    derived_ratio: float
    batch: ReplayBatch

    @property
    def can_rank(self) -> bool:
        return all(abs(r - 1) <= FIDELITY_TOLERANCE for r in (self.traced_ratio, self.derived_ratio))

    @property
    def sentence(self) -> str:
        both = (f"your config's traced step replays at {self.traced_ratio:.3f} of its time and its schedule derived "
                f"from the byte model at {self.derived_ratio:.3f} (median of {len(self.batch.of(0))} each)")
        if self.can_rank:
            return f"{both}: within {FIDELITY_TOLERANCE:.0%}, so replays rank the candidates they can represent"
        return (f"{both}: more than {FIDELITY_TOLERANCE:.0%} from the traced step, so the replay does not reproduce "
                "this job; every candidate runs real steps")


def check_fidelity(rp: Replays) -> FidelityCheck:
    """The traced step and your config's derived schedule replayed alternately, each against
    the time it stands for (ReplayError, ScheduleError: no ranking)."""
    traced = rp.base.schedule
    [derived] = align_starts([derive_schedule(rp.base, rp.knobs, rp.knobs, rp.shape)])
    aio = aio_of(rp.cfg, rp.knobs)
    batch = replay_batch(rp.journal, rp.target, FIDELITY, 0, [(traced, aio), (derived, aio)], FIDELITY_ORDER)
    return FidelityCheck(statistics.median(batch.of(0)) / traced.traced_s,
                         statistics.median(batch.of(1)) / derived.traced_s, batch)


def batch_estimate_s(fidelity: FidelityCheck, replays: int = 2 * FIRST_LOOK_PAIRS) -> float:
    """A replayer child of `replays` replays at your config's replay time, its start-up and
    layout as the fidelity child's."""
    b = fidelity.batch
    overhead = max(0.0, b.wall_s - sum(b.seconds) - SETTLE_S * len(b.seconds))
    return overhead + replays * (statistics.median(b.of(1)) + SETTLE_S)


def rank_candidate(rp: Replays, key: str, changes: dict[str, Any], knobs: OffloadKnobs, schedule: SwapSchedule,
                   reference: SwapSchedule, clock: SearchClock, estimate_s: float) -> ReplayRank | None:
    """`key` against your config on replays, in ABBA pairs until the rule decides or
    REPLAY_MAX_PAIRS (None: the budget did not hold its first look)."""
    rule = SequentialRule(noise_floor=rp.noise_floor, max_pairs=REPLAY_MAX_PAIRS)
    got = replay_pairs(rp.journal, rp.target, key, (reference, aio_of(rp.cfg, rp.knobs)),
                       (schedule, aio_of(rp.cfg, knobs)), rule,
                       lambda pairs: clock.fits(estimate_s * pairs / FIRST_LOOK_PAIRS))
    if got is None:
        return None
    return ReplayRank(key, changes, got.seconds, got.reference_seconds, got.decision.verdict,
                      describe_decision(got.decision))


def rank_all(rp: Replays, ranked: Sequence[tuple[str, dict[str, Any], OffloadKnobs, SwapSchedule]],
             clock: SearchClock, estimate_s: float) -> tuple[list[ReplayRank], list[str]]:
    """Every candidate ranked on replays, fastest first, and the keys left unranked (the budget
    did not hold their first look, or their replay failed: both said).
    The schedules share one start (align_starts), so their seconds compare across candidates;
    the rank is by the ratio to your config's replays in the same pairs, which a drive slower
    or faster from one candidate's replays to the next (a shared machine) does not move."""
    reference = derive_schedule(rp.base, rp.knobs, rp.knobs, rp.shape)
    aligned = align_starts([reference, *(s for *_, s in ranked)])
    out, left = [], []
    for (key, changes, knobs, _), schedule in zip(ranked, aligned[1:]):
        try:
            r = rank_candidate(rp, key, changes, knobs, schedule, aligned[0], clock, estimate_s)
        except ReplayError as e:
            rp.say(f"offload: the replay of {short_changes(changes)} failed ({e}): it is left unranked")
            r = None
        if r is None:
            left.append(key)
            continue
        rp.say(f"offload: replayed {short_changes(changes)}: median {r.median_s:.3f} s over {len(r.seconds)} "
               f"(spread {100 * r.spread:.1f} %), your config's {r.ratio:.3f}x that: {r.verdict}")
        out.append(r)
    return sorted(out, key=lambda r: (-r.ratio, r.key)), left


def replay_pick(ranked: Sequence[ReplayRank]) -> ReplayRank | None:
    """The fastest candidate the rule calls faster than your config on replays (None: none is)."""
    return next((r for r in ranked if r.verdict == "faster"), None)


def estimated_step_s(pick: ReplayRank, reference_step_s: float) -> float:
    """The pick's step on real steps, were the replay's saving all it changes: your config's
    measured step less the seconds its replays saved."""
    return reference_step_s - (statistics.median(pick.reference_seconds) - pick.median_s)

