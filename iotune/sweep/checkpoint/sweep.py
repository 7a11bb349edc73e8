"""The checkpoint sweep, as a library: `run_checkpoint_sweep(request)` runs
real save_checkpoint and load_checkpoint trials of the built-in workload or
of the user's job (iotune.sweep.checkpoint.trial), stage by stage over the
space of iotune.sweep.checkpoint.space, and picks the candidate with the
lowest interval cost (iotune.model.checkpoint_sweep) among those whose
checkpoint restores. DeepSpeed's defaults are always measured; a candidate
replaces the best so far only when it is cheaper.

Every trial is appended to the sweep journal, REQUEST.out_dir/journal.jsonl
(iotune.sweep.journal, as a "checkpoint-trial" record), the moment it ends
(fsync'ed, one whole line); the same request on the same drive resumes from
it, skipping completed trials, and another one keeps it aside and starts
anew, as every sweep does. A trial that fails is recorded, never fatal.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

from ... import __version__
from ...errors import UsageError
from ...fs.directio import direct_io_problem
from ...model.checkpoint import restarts_adam
from ...model.checkpoint_io import OFFLOADED
from ...model.checkpoint_sweep import (DEFAULTS, CandidateResult, CheckpointCandidate, CheckpointOutcome,
                                      CheckpointRequest, CheckpointTrial, RestoreCheck)
from ...model.journal import SweepEnv
from ..journal import NAME as JOURNAL_NAME, Journal, keep_aside, open_journal
from .space import aio_stage, refusal, target_stage, writeback_stage, writer_stage
from .trial import base_config, run_trial
from ..user_job import PLACEHOLDER

Say = Callable[[str], None]


def check_request(request: CheckpointRequest) -> None:
    """UsageError for input that cannot give a result, before anything runs."""
    for name, value in (("save_at", request.save_at), ("measure_steps", request.measure_steps),
                        ("restore_steps", request.restore_steps), ("repeats", request.repeats)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, not {value}")
    if request.interval_steps < request.measure_steps:
        raise UsageError(f"the checkpoint interval ({request.interval_steps} steps) is shorter than the steps "
                         f"measured after a save ({request.measure_steps}): raise the interval or measure fewer")
    for d in (request.swap_dir, *request.targets):
        if not Path(d).is_dir():
            raise UsageError(f"{d} is not a directory: create it on the drive to use")
    problem = direct_io_problem(request.swap_dir)
    if problem:
        raise UsageError(f"{request.swap_dir}: {problem}; DeepSpeed swaps with O_DIRECT: give a directory on "
                         f"ext4, xfs or btrfs on a block device")
    if request.steps_cmd:
        if not any(PLACEHOLDER in a for a in request.steps_cmd):
            raise UsageError(f"the job's command has no {PLACEHOLDER} placeholder: put {PLACEHOLDER} where it takes "
                             f"its DeepSpeed config")
        if not request.ds_config:
            raise UsageError("a user's job needs its DeepSpeed config (ds_config), into whose copies each "
                             "candidate's checkpoint settings go")


LEGACY_JOURNAL = "checkpoint-journal.jsonl"        # iotune before the one sweep journal: not resumed


def checkpoint_env(request: CheckpointRequest, drive: Mapping[str, object] | None = None) -> SweepEnv:
    """The journal's identity: the drive (default: the swap directory, as
    named), the request less where it swaps (a fresh directory each run)
    and writes its journal, and iotune's version."""
    request_id = json.loads(json.dumps(request.identity()))
    request_id.pop("swap_dir", None)
    on = json.loads(json.dumps(dict(drive) if drive is not None else {"path": request.swap_dir}, default=str))
    return SweepEnv(target=request.swap_dir, executor="checkpoint", drive=on, mode="checkpoint",
                    iotune_version=__version__, request=request_id)


def open_checkpoint_journal(request: CheckpointRequest, fresh: bool, say: Say,
                            drive: Mapping[str, object] | None = None) -> Journal:
    """The sweep journal in REQUEST.out_dir, for this request on this drive.
    A checkpoint journal of an older iotune there is refused (kept aside
    with `fresh`): its trials were recorded without the drive's identity."""
    out = Path(request.out_dir)
    legacy = out / LEGACY_JOURNAL
    if legacy.exists() and not fresh:
        raise UsageError(f"{legacy} is the journal of an older iotune's checkpoint sweep, which this one does not "
                         f"resume (its trials now go into {out / JOURNAL_NAME}, with the drive's identity): run "
                         f"again with --fresh to start a new journal (the old one is kept beside it, renamed), or "
                         f"give another -o/--out")
    if legacy.exists():
        say(f"checkpoint sweep: --fresh: the older journal {legacy.name} is kept as {keep_aside(legacy).name}")
    return open_journal(out, fresh, checkpoint_env(request, drive), say)


class Search:
    """The stages, the journal, and the trials run so far."""

    def __init__(self, request: CheckpointRequest, say: Say,
                 runner: Callable[[CheckpointRequest, CheckpointCandidate, int], CheckpointTrial],
                 journal: Journal) -> None:
        self.request, self.say, self.runner, self.journal = request, say, runner, journal
        self.config = base_config(request)
        self.tried: list[CheckpointCandidate] = []
        self.refused: dict[str, list[str]] = {}      # reason -> candidates refused for it, not yet said

    def trials_of(self, candidate: CheckpointCandidate) -> list[CheckpointTrial]:
        return [t for t in self.journal.checkpoint_trials if t.candidate == candidate]

    def measure(self, candidate: CheckpointCandidate) -> CandidateResult:
        if candidate not in self.tried:
            self.tried.append(candidate)
        why = refusal(self.request, candidate, self.config)
        for repeat in range(self.request.repeats):
            if self.journal.find_checkpoint(candidate, repeat) is not None:
                continue
            if why:
                self.journal.record_checkpoint(CheckpointTrial(candidate, repeat, "refused", why))
                self.refused.setdefault(why, []).append(candidate.label())
                break
            self.say(f"checkpoint: {candidate.label()} (repeat {repeat + 1}/{self.request.repeats})")
            trial = self.runner(self.request, candidate, repeat)
            self.journal.record_checkpoint(trial)
            self.say(f"  {_said(trial, self.request.interval_steps)}")
        return summarize(candidate, self.trials_of(candidate), self.request.interval_steps)

    def stage(self, best: CandidateResult, candidates: list[CheckpointCandidate]) -> CandidateResult:
        for c in candidates:
            r = self.measure(c)
            if better(r, best, self.request.measure_steps):
                best = r
        self.say_refused()
        return best

    def say_refused(self) -> None:
        """Each reason once, with the candidates refused for it."""
        for why, labels in self.refused.items():
            which = labels[0] if len(labels) == 1 else f"{len(labels)} candidates ({', '.join(labels)})"
            self.say(f"checkpoint: refused before running: {which}: {why}")
        self.refused.clear()


def run_checkpoint_sweep(request: CheckpointRequest, say: Say = lambda _: None,
                         runner: Callable[[CheckpointRequest, CheckpointCandidate, int], CheckpointTrial]
                         = run_trial, fresh: bool = False,
                         drive: Mapping[str, object] | None = None) -> CheckpointOutcome:
    """Measure DeepSpeed's defaults, then each stage; the outcome names the
    cheapest candidate whose checkpoint restores (None when none does).
    `fresh` starts a new journal (the old one kept aside); `drive` is the
    identity of the drive swapped to (default: the swap directory)."""
    check_request(request)
    s = Search(request, say, runner, open_checkpoint_journal(request, fresh, say, drive))
    defaults = s.measure(DEFAULTS)                  # never refused: no writer block, no dirty limit
    best = s.stage(defaults, writer_stage(request, DEFAULTS))
    best = s.stage(best, target_stage(request, best.candidate))
    best = s.stage(best, writeback_stage(request, best.candidate, offloaded_share(s.trials_of(best.candidate))))
    with_job_aio = best
    best = s.stage(best, aio_stage(request, best.candidate))
    results = tuple(summarize(c, s.trials_of(c), request.interval_steps) for c in s.tried)
    pick = best if best.restore_rank > 0 else None
    return CheckpointOutcome(request, tuple(s.journal.checkpoint_trials), results, defaults, pick,
                             aio_statement(request, with_job_aio, best, results),
                             tuple(notes(defaults, pick, restarts_adam(s.config))))


def summarize(candidate: CheckpointCandidate, trials: list[CheckpointTrial], interval_steps: int) -> CandidateResult:
    """Medians over the candidate's trials; it restores only if every trial
    ran and restored, the weights and the optimizer state apart."""
    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    bad = next((t for t in trials if not t.restores), None)
    reason = "" if bad is None else (bad.error or (bad.restore.reason if bad.restore else "not restored"))
    durable = [t.not_durable_bytes for t in trials if t.not_durable_bytes is not None]
    checks = [t.restore for t in trials if t.ok and t.restore is not None]
    shown = (bad.restore if bad is not None else None) or (checks[0] if checks else None)
    return CandidateResult(candidate, len(trials), bool(trials) and bad is None, med([t.save_s for t in trials]),
                           med([t.restore.load_s if t.restore else None for t in trials]),
                           med([t.interval_s(interval_steps) for t in trials]),
                           int(statistics.median(durable)) if durable else None, reason,
                           med([t.overhead_s() for t in trials]), med([t.jitter_s() for t in trials]) or 0.0,
                           *_restored(trials, checks), shown)


def _restored(trials: list[CheckpointTrial], checks: list[RestoreCheck]) -> tuple[bool | None, bool | None]:
    """(weights restored, optimizer state restored) over the trials: True
    when every trial's check says so, False when one says not, None when
    not checked (a trial refused or failed before its check)."""
    if any(not c.weights_ok for c in checks):
        return False, None
    if not trials or len(checks) < len(trials):
        return None, None
    optimizer = [c.optimizer_restored for c in checks]
    return True, (False if False in optimizer else True if all(optimizer) else None)


SAVE_AS_FAST = 1.10          # "saves as fast": within 10 %
DURABLE_GAIN = 0.5           # "more durable": at most half the bytes left in the page cache


def better(r: CandidateResult, best: CandidateResult, measured_steps: int = 1) -> bool:
    """`r` restores more than `best` (the weights and the optimizer state
    over the weights alone, over nothing), or as much and costs less beyond
    the noise: by the checkpoint's overhead when both use the same aio
    block, by the whole interval's cost when they do not; within the noise
    (the larger step jitter times the steps measured after the save), `r`
    wins only by being as fast to save and much more durable
    (iotune.model.checkpoint_sweep)."""
    if r.restore_rank == 0 or r.interval_s is None or r.overhead_s is None:
        return False
    if r.restore_rank != best.restore_rank:
        return r.restore_rank > best.restore_rank
    if best.interval_s is None or best.overhead_s is None:
        return True
    same_aio = r.candidate.aio == best.candidate.aio
    mine, theirs = (r.overhead_s, best.overhead_s) if same_aio else (r.interval_s, best.interval_s)
    margin = max(r.jitter_s, best.jitter_s) * max(1, measured_steps)     # each measured step adds its noise
    if mine < theirs - margin or mine > theirs + margin:
        return mine < theirs
    as_fast = r.save_s is not None and best.save_s is not None and r.save_s <= SAVE_AS_FAST * best.save_s
    return as_fast and (r.not_durable_bytes or 0) <= DURABLE_GAIN * (best.not_durable_bytes or 0) \
        and best.not_durable_bytes is not None and r.not_durable_bytes is not None


def offloaded_share(trials: list[CheckpointTrial]) -> float:
    done = [t for t in trials if t.ok and t.file_bytes]
    return statistics.median(t.part_bytes.get(OFFLOADED, 0) / t.file_bytes for t in done) if done else 0.0


def aio_statement(request: CheckpointRequest, job_aio: CandidateResult, best: CandidateResult,
                  results: tuple[CandidateResult, ...]) -> str:
    if best.candidate.writer.kind != "fast":
        return (f"the pick writes with {best.candidate.writer.label()}, which does not use the aio block: the aio "
                f"block tuned for swapping serves both")
    if not request.aio_candidates:
        return ("the fast writer writes through the top-level aio block swapping uses; only the job's own block "
                "was tried (pass other aio blocks, e.g. the swap sweep's pick, to compare)")
    if best.candidate == job_aio.candidate:
        return (f"the job's own aio block serves both: no other aio block tried made the interval cheaper "
                f"({_cost(job_aio)} per interval with it)")
    return (f"the checkpoint prefers another aio block ({best.candidate.label()}: {_cost(best)} per interval, "
            f"against {_cost(job_aio)} with the job's): the interval cost includes the steps, so this block "
            f"serves both")


def notes(defaults: CandidateResult, pick: CandidateResult | None, adam_restarts: bool = False) -> list[str]:
    out = []
    if defaults.restore_rank == 0:
        out.append(f"DeepSpeed's defaults do not restore this job either ({defaults.reason}): what the job keeps "
                   f"outside DeepSpeed's checkpoint, or DeepSpeed's own restore, is at fault, not the writer")
    if pick is None:
        out.append("no candidate's checkpoint restored the weights: nothing is recommended")
    elif pick.restore_rank == 1:
        out.append(optimizer_lost_note(adam_restarts))
    return out


def optimizer_lost_note(adam_restarts: bool) -> str:
    """Said once when every candidate that restored the weights lost the optimizer state."""
    why = ("DeepSpeed 0.19.8 restarts Adam after restoring a ZeRO-3 checkpoint with the optimizer offloaded to "
           "NVMe (lint rule checkpoint-nvme-optimizer-restart): whatever the writer, after a resume your "
           "training differs from the uninterrupted run from the second step on. " if adam_restarts else "")
    return (f"no candidate restored the optimizer state: every checkpoint that restored the weights lost it. {why}"
            f"The pick is chosen by the weights alone: expect a fresh Adam start after each resume (a learning-rate "
            f"warm-up helps){'; offload_optimizer device cpu restores the moments' if adam_restarts else ''}")


def _cost(r: CandidateResult) -> str:
    return "-" if r.interval_s is None else f"{r.interval_s:.2f} s"


def _restore_said(check: RestoreCheck) -> str:
    """The check's verdict; the losses too when the optimizer state was lost."""
    return check.reason if check.weights_ok and check.optimizer_restored is False else check.verdict()


def _said(t: CheckpointTrial, interval_steps: int) -> str:
    if t.status == "refused":
        return f"refused: {t.error}"
    if not t.ok:
        return f"failed: {t.error}"
    cost = t.interval_s(interval_steps)
    restore = "does NOT restore (not checked)" if t.restore is None else _restore_said(t.restore)
    return (f"save {t.save_s:.3f} s, {t.file_bytes / 1e6:.1f} MB, interval {cost:.2f} s; {restore}"
            if t.save_s is not None and cost is not None else restore)
