"""The offload search's stages between the reference trial and the pairs:
the replay's fidelity and which candidates it can rank, the plan fitted to
the budget, the ranking itself, and the one pick that goes to the
confirmation pairs (iotune.sweep.offload.search calls them in that order)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...model.offload import JobShape, OffloadKnobs
from ...model.offload_plan import (PlanCosts, ReplayOutcome, ReplayRank, SearchPlan, fit_plan, undecided_pairs,
                                   undecided_unrun)
from ...model.offload_result import OffloadTrial, Prediction, short_changes
from ...model.replay import ScheduleError, SwapSchedule
from ..executor import Target
from ..journal import Journal
from ..replay import ReplayError
from ..budget import SearchClock
from .confirm import Confirmation, confirm_pairs
from ...model.offload_schedule import replay_refusal
from .replay_rank import (SETTLE_S, CapturingRunner, FidelityCheck, Replays, batch_estimate_s, check_fidelity,
                          estimated_step_s, rank_all, replay_pick, split)

if TYPE_CHECKING:
    from .search import OffloadSearch, Trials

FIDELITY_START_S = 60.0       # a replayer child's start-up (torch and DeepSpeed), for the fidelity check's estimate


@dataclass(frozen=True)
class ReplayStage:
    """What the replay can do for this search: its outcome so far (fidelity, refusals),
    the candidates it ranks with their derived schedules, and the estimate per candidate."""

    outcome: ReplayOutcome
    replays: Replays | None = None
    derived: tuple[tuple[str, OffloadKnobs, SwapSchedule], ...] = ()
    batch_s: float = 0.0
    elsewhere: frozenset[str] = field(default_factory=frozenset)    # keys left to real steps

    def real(self, by_key: dict[str, OffloadKnobs]) -> list[OffloadKnobs]:
        """The candidates that run on real steps: all but those the replay ranks."""
        mine = {k for k, _, _ in self.derived}
        return [k for key, k in by_key.items() if key not in mine]


def no_replay(why: str) -> ReplayStage:
    return ReplayStage(ReplayOutcome(False, why))


def prepare_replays(capture: CapturingRunner, journal: Journal, ref_key: str, reference: OffloadKnobs,
                    candidates: Sequence[tuple[str, OffloadKnobs]], shape: JobShape, cfg: dict[str, Any],
                    target: Target, say: Callable[[str], None], clock: SearchClock,
                    noise_floor: float) -> ReplayStage:
    """The reference's steady step (journaled), the fidelity check, and which candidates
    the replay ranks (the rest: real steps, with why)."""
    why = replay_refusal(reference, reference)
    if why:
        return no_replay(f"no replay: {why}")
    base = journal.find_replay_base(ref_key)
    if base is None and capture.base is not None:
        base = capture.base
        journal.record_replay_base(ref_key, base)
    if base is None:
        return no_replay(f"no replay: {capture.error or 'the reference trial left no steady step to replay'}")
    refused = [(key, replay_refusal(reference, knobs)) for key, knobs in candidates]
    if all(why for _, why in refused):        # nothing the replay could rank: no fidelity replays either
        why = ("no candidate changes only what the replay represents, so each runs real steps" if refused
               else "no candidate to rank")
        return ReplayStage(ReplayOutcome(False, f"no replay: {why}",
                                         real_steps=tuple((short_changes(_changes(k)), w) for k, w in refused)))
    rp = Replays(base, reference, shape, cfg, target, journal, say, noise_floor)
    if journal.find_replay("fidelity", 0) is None and \
            not clock.fits(FIDELITY_START_S + 4 * (base.schedule.traced_s + SETTLE_S)):
        return no_replay("no replay: the budget leaves no time for the fidelity replays")
    say("offload: replaying your config's step (the traced one, and the one derived from the byte model) to see "
        "whether replays reproduce it ...")
    try:
        fc = check_fidelity(rp)
    except (ReplayError, ScheduleError) as e:
        return no_replay(f"no replay: {e}")
    say(f"offload: {fc.sentence}")
    if not fc.can_rank:
        return ReplayStage(_outcome(fc, False))
    derived, rest = split(rp, candidates)
    return ReplayStage(_outcome(fc, True, tuple((short_changes(_changes(k)), w) for k, w in rest)),
                       rp, tuple(derived), batch_estimate_s(fc), frozenset(k for k, _ in rest))


def _outcome(fc: FidelityCheck, can_rank: bool, real_steps: tuple[tuple[str, str], ...] = ()) -> ReplayOutcome:
    return ReplayOutcome(can_rank, fc.sentence, round(fc.traced_ratio, 4), round(fc.derived_ratio, 4),
                         real_steps=real_steps)


def _changes(key: str) -> dict[str, Any]:
    """A candidate's changes from its key (the trials' key: the changes as JSON)."""
    return dict(json.loads(key))


def make_plan(stage: ReplayStage, clock: SearchClock, trial_s: float, real: int, max_pairs: int) -> SearchPlan:
    """The plan within what is left of the budget; replays the journal holds cost nothing."""
    costs = PlanCosts(trial_s, stage.batch_s, clock.spent_s())
    return fit_plan(clock.budget_s or 0.0, clock.source, costs, len(stage.derived), real, max_pairs,
                    journaled=len(_journaled_first(stage)))


def _journaled_first(stage: ReplayStage) -> list[str]:
    """The replayable candidates whose first look is in the journal (ranked first: they cost nothing)."""
    if stage.replays is None:
        return []
    return [key for key, _, _ in stage.derived if stage.replays.journal.find_replay(key, 0) is not None]


def rank(stage: ReplayStage, plan: SearchPlan, clock: SearchClock) -> ReplayOutcome:
    """The replay ranking of the plan's candidates (the rest: undecided, on the clock)."""
    if stage.replays is None:
        return stage.outcome
    free = set(_journaled_first(stage))
    todo = sorted(((key, _changes(key), knobs, s) for key, knobs, s in stage.derived), key=lambda t: t[0] not in free)
    ranked, left = rank_all(stage.replays, todo[:plan.replay_candidates], clock, stage.batch_s)
    cut = [key for key, *_ in todo[plan.replay_candidates:]]
    clock.stopped = clock.stopped or bool(cut)
    for key in left + cut:
        clock.undecided.append(undecided_unrun(short_changes(_changes(key)), "not ranked on replays",
                                               stage.batch_s))
    pick = replay_pick(ranked)
    o = stage.outcome
    return ReplayOutcome(o.can_rank, o.fidelity, o.traced_ratio, o.derived_ratio, tuple(ranked),
                         pick.key if pick else "", o.real_steps)


def run_real(chosen: Sequence[Prediction], plan: SearchPlan, clock: SearchClock,
             run: Callable[[Prediction], OffloadTrial], journaled: Callable[[Prediction], bool]) -> list[OffloadTrial]:
    """The plan's real-step candidate trials, those predicted fastest first, while the budget holds."""
    out, fresh = [], 0
    for p in chosen:
        if not journaled(p):
            if fresh >= plan.real_trials or not clock.fits(plan.trial_s):
                clock.stopped = True
                clock.undecided.append(undecided_unrun(short_changes(p.changes), "not run on real steps",
                                                       plan.trial_s))
                continue
            fresh += 1
        out.append(run(p))
    return out


def pick(replay: ReplayOutcome, best: OffloadTrial | None, reference_step_s: float) -> tuple[str, str]:
    """(the key of the one candidate the pairs confirm, "replay" | "real steps"; ("", "") none):
    the replay's pick against the fastest real-step trial, the replay's at your config's
    measured step less the seconds its replays saved."""
    chosen: ReplayRank | None = next((r for r in replay.ranked if r.key == replay.pick), None)
    if chosen is not None and (best is None or estimated_step_s(chosen, reference_step_s) < best.step_s):
        return chosen.key, "replay"
    return (best.key, "real steps") if best is not None else ("", "")


@dataclass(frozen=True)
class Staged:
    """What the replay ranking and the budget add to a search's outcome."""

    replay: ReplayOutcome
    plan: SearchPlan
    clock: SearchClock


def confirm_pick(search: OffloadSearch, shape: JobShape, trials: Trials, reference: OffloadKnobs,
                 measured: tuple[OffloadTrial, list[OffloadTrial], dict[str, OffloadKnobs]],
                 staged: Staged | None) -> tuple[Confirmation, OffloadTrial | None, str]:
    """The one pick (the replay's, or the fastest real-step trial's) confirmed in pairs
    within the plan and the budget: (the pairs, the fastest real-step trial, what picked)."""
    ref_trial, ran, by_key = measured
    best = max((t for t in ran if t.status == "ok"), key=lambda t: (t.samples_per_s, t.key), default=None)
    if staged is None:
        key, by = (best.key, "real steps") if best is not None else ("", "")
    else:
        key, by = pick(staged.replay, best, ref_trial.step_s)
    if not key:
        return Confirmation((), "none", None, None), best, ""
    confirm = confirm_pairs(by_key[key], reference, shape, trials, search, staged.clock if staged else None,
                            staged.plan.max_pairs if staged else None, 2 * ref_trial.seconds)
    return confirm, best, by


def staged_fields(staged: Staged | None, confirm: Confirmation, picked: dict[str, Any],
                  picked_by: str) -> dict[str, Any]:
    """The outcome's replay, plan, stop and undecided fields (`picked`: the pick's changes)."""
    if staged is None:
        return {}
    undecided = list(staged.clock.undecided)
    if confirm.candidate is not None and confirm.verdict in ("undecided", "none"):
        d = confirm.rule
        undecided.insert(0, undecided_pairs(short_changes(picked), d.more_pairs_needed if d else 0, confirm.more_s,
                                            least=d is None or not d.estimated))
    stopped = "budget" if staged.clock.stopped or confirm.stopped == "budget" else confirm.stopped
    return {"replay": staged.replay, "plan": staged.plan, "stopped": stopped, "undecided": tuple(undecided),
            "picked": picked, "picked_by": picked_by}
