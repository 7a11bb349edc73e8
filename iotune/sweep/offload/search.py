"""The whole-offload search on real steps (`iotune sweep offload`).

    shape     the job's parameter tensors: the built-in model's are known; the
              user's job is started once and stopped at deepspeed.initialize,
              before DeepSpeed allocates anything (the startup hook reports them;
              iotune.sweep.offload.probe: journaled, so a resume does not start it)
    fit       every candidate of iotune.sweep.offload.space, checked against
              DeepSpeed's bounds and the host's memory (iotune.model.host_memory):
              one that cannot work is refused with the numbers, never run. When
              the job's own config does not fit, the reference is the smallest
              change that does, and the report says so
    reference the job's own config (or that change), run once (your config is
              admitted without the margin: you run it already): its step time and
              the time it waits on swaps calibrate the step-time model, and its
              steady step's swaps are kept for the replay; its peak (VmHWM)
              corrects the host-memory predictions that follow, and the
              candidates are admitted again with the smaller margin measured
              for corrected predictions (iotune.sweep.offload.memory)
    replay    the reference's step replayed as traced and as derived from the
              byte model: within 5 % of the traced time, candidates that change
              only how the optimizer's state is cut and moved are ranked on
              replays of their derived schedules (iotune.sweep.offload.stages,
              .replay_rank); otherwise every candidate runs real steps
    plan      what the search runs, fitted to its time budget (--budget, or 24
              reference trials), printed before it starts
    predict   the other candidates' step times (iotune.model.offload_time) from
              their bytes per step, the drive's rates measured with fio, and the
              reference's compute
    run       real steps only for the candidates predicted within `margin` of the
              best prediction (at most `max_trials`, and what the plan holds); a
              trial ends as soon as its steady steps agree (offload_runner.TrialPlan)
    confirm   one pick, the replay's or the fastest real-step trial's, against the
              reference in pairs, one pair at a time, until the sequential rule
              decides, --max-pairs or the budget (iotune.sweep.offload.confirm); two
              configs the pairs find equal are ranked by what else they cost; what
              the budget left undecided is said, with what deciding it would take

Every trial is journaled the moment it ends (the sweep journal, its identity
in the header) and a re-run takes what the journal has.

The fastest search trial goes straight to the pairs. It used to go there
only when its one trial had more samples per second than the reference's
one trial: an unpaired gate. At the scale it matters (a 1B job's step
varies 9-14 % run to run) that comparison of two single trials is close to a
coin toss for the gains worth finding, and the best of several noisy
trials is biased upward (the winner's curse), so the gate neither kept a
slower pick out nor let a real gain through reliably. The pairs are the
gate now: a pick clearly no faster is "within noise" or "slower" after 3
pairs, and a close one stays undecided with the pairs it would need."""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...errors import IotuneError, UsageError
from ...host.ledger import temp_dir
from ...model import units
from ...model.host_memory import CALIBRATED_MARGIN, HostContext, host_memory
from ...model.offload import JobShape, OffloadKnobs, step_swap_bytes, sub_groups
from ...model.offload_result import OffloadOutcome, OffloadTrial, Prediction, WhatIf, short_changes
from ...model.offload_time import DriveRates, Reference, median_abs_error, predict_step_s
from ..config import nvme_sections
from ..drive_rates import aio_point, measure_drive_rates
from ..executor import Target
from ..journal import Journal
from ..budget import SearchClock, clock_for
from .replay_rank import CapturingRunner
from .runner import RunResult, Runner, TrialPlan, samples_per_step
from .memory import (baseline_sentence, corrected, correction_sentence, host_baseline, job_context, memory_now,
                     skipped_trial)
from .stages import Staged, confirm_pick, make_plan, prepare_replays, rank, run_real, staged_fields
from .space import KEYS, Budget, candidates, dimensions, refusals
from .confirm import Confirmation, Cost, cost_of, rank_by_cost, tie_break
from .changes import apply_changes, knob_changes
from .probe import job_shape, partitioned_in
from .what_if import ZENFLOW_TOPK, ZENFLOW_WHAT_IF, what_if_plan, what_if_refusal

ASSUMED_ERROR = 0.15       # the step-time model's error before any trial measured it (the wide grid: 0.17)


@dataclass(frozen=True)
class OffloadSearch:
    """What one search runs: the job, its config, the candidates' bounds,
    how long each trial runs and how many are allowed."""

    base_cfg: dict[str, Any]
    runner: Runner
    fixes: dict[str, Any] = field(default_factory=dict)
    budget: Budget = Budget()
    context: HostContext = HostContext()
    plan: TrialPlan = TrialPlan()
    max_trials: int = 12
    max_pairs: int = 6
    noise_floor: float = 0.05
    what_if: tuple[str, tuple[float, ...]] | None = None
    time_budget_s: float | None = None          # --budget (None: derived from the reference trial's time)


class Trials:
    """Runs and journals the search's trials; a trial the journal has is taken from it."""

    def __init__(self, search: OffloadSearch, base: OffloadKnobs, shape: JobShape, target: Target, journal: Journal,
                 say: Callable[[str], None]) -> None:
        self.search, self.base, self.shape, self.target, self.journal, self.say = search, base, shape, target, \
            journal, say
        self.ran = 0

    def run(self, knobs: OffloadKnobs, role: str, nth: int = 0, extra: dict[str, Any] | None = None,
            predicted_s: float = 0.0, rates: DriveRates | None = None, pair_order: str = "") -> OffloadTrial:
        changes = {**knob_changes(self.base, knobs), **(extra or {})}
        key = json.dumps(changes, sort_keys=True)
        seen = self.journal.find_offload(key, role, nth)
        if seen is not None:
            return seen
        budget = self.search.budget
        if role == "reference" and not changes:         # your own config: admitted without the margin
            budget = replace(budget, margin=0.0)
        now = memory_now(knobs, self.shape, budget, self.search.context)     # MemAvailable, read again
        if now.skip:
            skipped = skipped_trial(key, changes, role, self.search.runner.what, now, self.search.context)
            self.journal.record_offload(skipped)
            self.say(f"offload: {role} {short_changes(changes)}: {skipped.error}")
            return skipped
        self.say(f"offload: {role} {short_changes(changes)}" + (f", predicted {predicted_s:.2f} s/step" if
                                                                  predicted_s else "") + " ...")
        t0 = time.monotonic()
        with contextlib.ExitStack() as stack:          # the trial's directory, recorded: a hard kill leaves nothing
            work = temp_dir(stack, ".iotune-offload-", self.target.files_dir)
            (work / "swap").mkdir()
            cfg = apply_changes(self.search.base_cfg, changes, str(work / "swap"))
            r = self.search.runner.run(cfg, work, self.target.cgroup, self.search.plan)
        t = self._record(knobs, key, changes, role, r, round(time.monotonic() - t0, 3), predicted_s)
        t = replace(t, available_bytes=now.available_bytes or 0, baseline_bytes=self.search.context.baseline_bytes,
                    baseline_source=self.search.context.baseline_source)
        if rates is not None:
            t = replace(t, drive_rates=asdict(rates))
        t = replace(t, pair_order=pair_order)
        self.journal.record_offload(t)
        self.ran += 1
        self.say(f"offload: {short_changes(changes)}: " + (
            f"{t.step_s:.2f} s/step ({len(t.step_times_s)} steady), waiting on I/O {t.io_wait_s:.2f} s, locked "
            f"{units.mb(t.locked_bytes)} MB (predicted {units.mb(t.predicted_locked_bytes)}), peak RSS "
            f"{units.mb(t.peak_rss_bytes)} MB (predicted {units.mb(t.predicted_host_bytes)}); {t.seconds:.0f} s"
            if r.status == "ok" else f"failed: {r.error}"))
        return t

    def _record(self, knobs: OffloadKnobs, key: str, changes: dict[str, Any], role: str, r: RunResult,
                seconds: float, predicted_s: float) -> OffloadTrial:
        mem = host_memory(knobs, self.shape, self.search.context)
        return OffloadTrial(key, changes, r.status, r.error, r.samples_per_s, r.optimizer_step_s, r.step_s,
                            r.locked_bytes, mem.locked_bytes, r.rss_bytes, seconds, role,
                            r.samples_per_s * self.search.runner.seq_len, dict(r.swap_bytes),
                            2 * sum(step_swap_bytes(knobs, self.shape).values()), r.io_wait_s,
                            self.search.runner.what, round(predicted_s, 4), list(r.step_times_s), r.peak_rss_bytes,
                            mem.peak_bytes)


def search_offload(search: OffloadSearch, target: Target, journal: Journal,
                   say: Callable[[str], None] = lambda s: None) -> OffloadOutcome:
    refusal = what_if_refusal(search.what_if, search.base_cfg)
    if refusal:
        raise UsageError(refusal)
    clock = clock_for(search.time_budget_s)
    probe = job_shape(search, target, journal, say)
    shape = probe.shape
    search = replace(search, context=job_context(search.context, probe.startup))
    say(baseline_sentence(search.context))
    base = partitioned_in(OffloadKnobs.from_ds_config(search.base_cfg), probe.partition_dtype)
    searched, skipped = dimensions(base, shape, search.fixes)
    fit, refused = candidates(base, shape, searched, search.fixes, search.budget, search.context)
    # your own config, the run everything is learnt from, is admitted without the margin: it is what you run
    # already, and its trial corrects the predictions (and the margin) of every candidate after it
    over = refusals(base, shape, replace(search.budget, margin=0.0), search.context)
    reference = base if not over else smallest_fitting_change(base, fit, shape)
    if over:
        say(f"offload: the job's own config does not fit: {'; '.join(over)}. "
            + (f"The reference is the smallest change that fits: {short_changes(knob_changes(base, reference))}"
               if reference is not None else "No candidate fits either"))
    say(f"offload: {len(fit)} candidate(s) fit, {len(refused)} refused ({search.runner.what})")
    capture = CapturingRunner(search.runner)
    trials = Trials(replace(search, runner=capture), base, shape, target, journal, say)
    if reference is None or not searched:
        if not searched:
            say("offload: nothing to search: every dimension is left out (the reasons are in the report)")
        return _outcome(search, base, shape, searched, skipped, refused, trials, over, reference, [], None)
    ref_key = json.dumps(knob_changes(base, reference), sort_keys=True)
    known = journal.find_offload(ref_key, "reference", 0)
    rates = DriveRates(**known.drive_rates) if known and known.drive_rates else drive_rates(search, target, say)
    capture.armed = journal.find_replay_base(ref_key) is None
    ref_trial = trials.run(reference, "reference", rates=rates)
    if ref_trial.status != "ok":
        raise IotuneError(f"the reference config ({short_changes(knob_changes(base, reference))}) "
                          f"{'failed on real steps' if ref_trial.status == 'failed' else 'did not run'}: "
                          f"{ref_trial.error}; nothing can be predicted without one measured run")
    clock.default_from(ref_trial.seconds)
    search, fit, refused = _corrected(search, trials, ref_trial, base, shape, searched, fit, refused, say)
    predictions, ran, by_key, staged = _rank_and_run(search, trials, capture, clock, fit, reference, ref_trial, rates)
    return _outcome(search, base, shape, searched, skipped, refused, trials, over, reference, predictions,
                    (ref_trial, ran, by_key), staged)


def _corrected(search: OffloadSearch, trials: Trials, ref_trial: OffloadTrial, base: OffloadKnobs, shape: JobShape,
               searched: list[Any], fit: list[OffloadKnobs], refused: list[Any],
               say: Callable[[str], None]) -> tuple[OffloadSearch, list[OffloadKnobs], list[Any]]:
    """The search once your config's trial has measured its peak: every
    prediction corrected by what it measured above its own, and the
    candidates admitted again with the margin for corrected predictions."""
    context = corrected(search.context, ref_trial)
    if context is None:
        return search, fit, refused
    budget = replace(search.budget, margin=CALIBRATED_MARGIN)
    search = replace(search, context=context, budget=budget)
    trials.search = replace(trials.search, context=context, budget=budget)
    now_fit, now_refused = candidates(base, shape, searched, search.fixes, budget, context)
    say(correction_sentence(context, len(now_fit), len(fit)))
    return search, now_fit, now_refused


def _rank_and_run(search: OffloadSearch, trials: Trials, capture: CapturingRunner, clock: SearchClock,
                  fit: list[OffloadKnobs], reference: OffloadKnobs, ref_trial: OffloadTrial,
                  rates: DriveRates) -> tuple[list[Prediction], list[OffloadTrial], dict[str, OffloadKnobs], Staged]:
    """After the reference trial: the replay check, the prediction of what the replay cannot
    rank, the plan within the budget (printed), the replay ranking, the real-step trials."""
    journal, say, base, shape = trials.journal, trials.say, trials.base, trials.shape
    by_key = {json.dumps(knob_changes(base, k), sort_keys=True): k for k in fit}
    stage = prepare_replays(capture, journal, json.dumps(knob_changes(base, reference), sort_keys=True), reference,
                            [(k, v) for k, v in by_key.items() if v != reference], shape, search.base_cfg,
                            trials.target, say, clock, search.noise_floor)
    predictions = predict_all(stage.real(by_key), shape, Reference(reference, ref_trial.step_s, ref_trial.io_wait_s),
                              rates, reference, search)
    chosen = [p for p in predictions if p.run]
    say(f"offload: predicted {len(predictions)} candidate(s) for real steps; {len(chosen)} to run (those within "
        f"{100 * max(search.noise_floor, ASSUMED_ERROR):.0f} % of the best prediction, at most {search.max_trials})")

    def journaled(p: Prediction) -> bool:
        return journal.find_offload(p.key, "search", 0) is not None
    plan = make_plan(stage, clock, ref_trial.seconds, sum(not journaled(p) for p in chosen), search.max_pairs)
    for line in plan.describe():
        say(f"offload: {line}")
    replay = rank(stage, plan, clock)
    ran = run_real(chosen, plan, clock, lambda p: trials.run(by_key[p.key], "search", predicted_s=p.step_s),
                   journaled)
    return predictions, ran, by_key, Staged(replay, plan, clock)


def _outcome(search: OffloadSearch, base: OffloadKnobs, shape: JobShape, searched: list[Any], skipped: list[Any],
             refused: list[Any], trials: Trials, over: tuple[str, ...], reference: OffloadKnobs | None,
             predictions: list[Prediction], measured: tuple[OffloadTrial, list[OffloadTrial], dict[str, OffloadKnobs]]
             | None, staged: Staged | None = None) -> OffloadOutcome:
    confirm, best, picked_by = Confirmation((), "none", None, None), None, ""
    if measured is not None and reference is not None:
        confirm, best, picked_by = confirm_pick(search, shape, trials, reference, measured, staged)
    chosen_knobs = confirm.candidate if confirm.verdict == "faster" else reference if over else None
    tied, d = "", confirm.rule
    if d is not None and d.equal and confirm.candidate is not None and reference is not None:
        chosen_knobs, ranked = _cheaper(confirm.candidate, reference, base, shape, search, over)
        tied = tie_break(ranked, confirm.ratios, d)
    chosen = knob_changes(base, chosen_knobs) if chosen_knobs is not None else {}
    rows = run_what_if(search, trials, chosen_knobs or reference or base, shape) if search.what_if else ()
    done = [t for t in trials.journal.offload_trials if t.predicted_step_s > 0 and t.status == "ok"]
    cfg = search.base_cfg
    return OffloadOutcome(
        search.runner.what, knob_changes(OffloadKnobs(), base), tuple(searched), tuple(skipped), tuple(refused),
        tuple(trials.journal.offload_trials), best, confirm.ratios, confirm.verdict, str(trials.journal.path),
        apply_changes(cfg, chosen, next((p for p in nvme_sections(cfg).values() if p), str(trials.target.directory))),
        {k: _reason(k, v, base, shape, bool(tied)) for k, v in chosen.items()}, rows, confirm.gain,
        reference_changes=knob_changes(base, reference) if reference is not None else {},
        base_over=over, predictions=tuple(predictions), recommended_changes=chosen,
        step_error=median_abs_error([(t.predicted_step_s, t.step_s) for t in done]),
        trials_run_now=trials.ran, decision=confirm.decision, tie_break=tied,
        more_pairs=d.more_pairs_needed if d and confirm.ratios else 0, more_s=confirm.more_s,
        memory=host_baseline(search.context, search.budget.margin),
        **staged_fields(staged, confirm, knob_changes(base, confirm.candidate) if confirm.candidate is not None else {},
                        picked_by))


def _cheaper(candidate: OffloadKnobs, reference: OffloadKnobs, base: OffloadKnobs, shape: JobShape,
             search: OffloadSearch, over: tuple[str, ...]) -> tuple[OffloadKnobs | None, list[Cost]]:
    """Candidate and reference equal within the pairs' resolution: the one
    that costs less (rank_by_cost; the reference kept: None, or itself when
    the job's own config does not fit), and the ranking."""
    ref = cost_of(short_changes(knob_changes(base, reference)) if over else "your config", reference, shape, search)
    ranked = rank_by_cost([ref, cost_of(short_changes(knob_changes(base, candidate)), candidate, shape, search)])
    return (reference if over else None) if ranked[0] is ref else candidate, ranked


def smallest_fitting_change(base: OffloadKnobs, fit: list[OffloadKnobs], shape: JobShape) -> OffloadKnobs | None:
    """The fitting candidate closest to `base`: the fewest changed keys, the
    same placement first, then the most host memory (the least cut)."""
    def distance(k: OffloadKnobs) -> tuple[int, int, int]:
        moved = (k.optimizer_device != base.optimizer_device) + (k.param_device != base.param_device)
        return moved, len(knob_changes(base, k)), -host_memory(k, shape).peak_bytes
    return min(fit, key=lambda k: (distance(k), repr(k)), default=None)


def drive_rates(search: OffloadSearch, target: Target, say: Callable[[str], None]) -> DriveRates:
    """The drive's rates at the config's aio settings (fio, seconds)."""
    point = aio_point(search.base_cfg)
    rates = measure_drive_rates(point, target)
    say(f"offload: the drive at {units.size(point.block_size)} x {point.queue_depth}: read "
        f"{units.rate(rates.read_bytes_per_s)} MB/s, write {units.rate(rates.write_bytes_per_s)} MB/s alone; "
        f"{units.rate(rates.mixed_read_bytes_per_s)} and {units.rate(rates.mixed_write_bytes_per_s)} MB/s at once")
    return rates


def predict_all(fit: list[OffloadKnobs], shape: JobShape, reference: Reference, rates: DriveRates,
                ref_knobs: OffloadKnobs, search: OffloadSearch) -> list[Prediction]:
    """Every fitting candidate's predicted step, fastest first; `run` marks
    those within the margin of the best (the reference itself is not re-run)."""
    base = OffloadKnobs.from_ds_config(search.base_cfg)
    rows = sorted(((predict_step_s(k, shape, reference, rates), k) for k in fit if k != ref_knobs),
                  key=lambda p: (p[0], repr(p[1])))
    margin = max(search.noise_floor, ASSUMED_ERROR)
    best = rows[0][0] if rows else 0.0
    out = []
    for i, (s, k) in enumerate(rows):
        near = s <= best * (1 + margin) or i < 2
        run = near and i < search.max_trials
        why = ("" if run else f"predicted {s:.2f} s/step, more than {100 * margin:.0f} % over the best prediction "
                              f"({best:.2f} s)" if not near else f"--max-trials {search.max_trials} reached")
        out.append(Prediction(json.dumps(knob_changes(base, k), sort_keys=True), knob_changes(base, k), round(s, 4),
                              run, why))
    return out


def run_what_if(search: OffloadSearch, trials: Trials, knobs: OffloadKnobs, shape: JobShape) -> tuple[WhatIf, ...]:
    key, values = search.what_if or ("", ())
    trials.say(f"offload: what-if {key} = {', '.join(f'{v:g}' for v in values)} on "
               f"{short_changes(knob_changes(trials.base, knobs))} (changes the training itself: reported, never "
               f"applied)")
    rows = []
    own = search.base_cfg.get(key)
    for value in values:
        plan = what_if_plan(search.plan, key, value, search.base_cfg)
        same = measured_as_is(trials, knobs) if plan == search.plan and own == value else None
        if same is not None:
            trials.say(f"offload: what-if {key} = {value:g} is the config's own value: its {same.role} trial measured "
                       f"it, not run again")
            t = same
        else:
            runs = trials if plan == search.plan else Trials(replace(search, plan=plan), trials.base, trials.shape,
                                                               trials.target, trials.journal, trials.say)
            t = runs.run(knobs, "what-if", 0, {key: int(value) if key != ZENFLOW_TOPK else value})
            trials.ran += runs.ran if runs is not trials else 0
        rows.append(_what_if_row(key, value, t, knobs, shape, {**search.base_cfg, key: value}))
    return tuple(rows)


def measured_as_is(trials: Trials, knobs: OffloadKnobs) -> OffloadTrial | None:
    """A trial of this search that already ran `knobs` with the config's own training settings and the
    search's plan (the reference, or a search or pair trial of it), if one completed: a what-if at the
    config's own value is that trial, not a second run of it."""
    key = json.dumps(knob_changes(trials.base, knobs), sort_keys=True)
    return next((t for t in trials.journal.offload_trials if t.key == key and t.status == "ok"
                 and t.role in ("reference", "search", "pair-base", "pair-candidate")), None)


def _what_if_row(key: str, value: float, t: OffloadTrial, knobs: OffloadKnobs, shape: JobShape,
                 cfg: dict[str, Any]) -> WhatIf:
    shown: Any = value if key == ZENFLOW_TOPK else int(value)
    if t.status != "ok":
        return WhatIf(key, shown, t.status, t.error)
    moved = 2 * sum(step_swap_bytes(knobs, shape).values())
    per_s = t.samples_per_s
    if key in ZENFLOW_WHAT_IF and t.step_times_s:
        # ZenFlow's steps are not alike: the mean over whole update intervals, not the median step
        per_s = t.samples_per_s * t.step_s / statistics.fmean(t.step_times_s)
    return WhatIf(key, shown, "ok", "", per_s, t.optimizer_step_s / t.step_s if t.step_s else 0.0,
                  moved / samples_per_step(cfg))


def _reason(key: str, value: Any, base: OffloadKnobs, shape: JobShape, tied: bool = False) -> str:
    attr = KEYS[key][0]
    if attr == "optimizer_device" and value == "cpu":
        return "the optimizer state fits in RAM: nothing of it crosses the drive"
    if attr == "sub_group_size":
        groups = len(sub_groups(replace(base, sub_group_size=int(value)), shape))
        return f"{groups} sub-group(s) per rank: the swap unit, and what pipelining can overlap"
    if attr in ("pipeline_read", "pipeline_write"):
        return "overlaps one sub-group's swap with the next one's Adam step"
    if attr == "optimizer_buffer_count":
        return "what the pipelining mode needs (DeepSpeed fails with fewer)"
    if tied:
        return f"as fast on this job's steps as {getattr(base, attr)!r} within noise, and cheaper (see the tie-break)"
    return f"faster on this job's steps than {getattr(base, attr)!r}"

