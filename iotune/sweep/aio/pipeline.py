"""One `iotune sweep`, as one pipeline that runs one way:

    propose points -> measure (executor + journal) -> rank
        -> rank the finalists on the replay of the job's own swap I/O
           (recorded from one run at DeepSpeed's defaults, trusted only when
           it reproduces that run's step; alternating pairs with the
           defaults until the confirmation rule decides)
        -> confirm on training steps (the replay's pick, or every finalist
           when the replay cannot rank, vs DeepSpeed's defaults,
           alternating pairs until the confirmation rule decides) ->
           recommend (never slower than the defaults beyond the measured
           noise) -> CPU-optimizer threads

Each stage is a module of its own (propose, measure, rank, replay_rank,
confirm, recommend); what passes between them are model records (Proposal,
Trial, Ranked, ReplayRanking, SweepOutcome). This module checks the target,
opens the journal and runs the stages in that order."""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ... import __version__
from ...opbuild.oplocks import stale_lock_problem
from ...errors import UsageError
from ...model.journal import SweepEnv
from ...model.sweep import SweepPoint, Trial
from ...model.aio_replay import ReplayRanking
from ...model.sweep_result import Progress, Ranked, StepGain, SweepOutcome
from ...workloads.fastops import ops_to_build
from ..user_job import CommandExecutor, UserJob, swap_note
from .confirm import confirm_on_steps, finalists
from .replay_rank import Stage, can_record, rank_on_replay
from ..sequential import SequentialRule
from ..executor import Executor, Target
from ..fio_executor import FioExecutor
from ..target import SWEEPS_DIR, check_target
from ..journal import open_journal
from ..measure import Measurer
from .propose import default_point, planned_trials, propose
from .rank import rank, summarize_trials
from .recommend import ds_fragment, pick, validate_with_deepspeed
from ..space import Profile, RunSettings, SearchSpace
from .steps_executor import StepsExecutor
from .threads import best_threads, sweep_threads, thread_values
from ..budget import clock_for
from .budget import AioBudget


def _aio() -> Executor:
    from .executor import (
        AioExecutor,  # imports nothing heavy itself; the trials run DeepSpeed
    )

    return AioExecutor()


EXECUTORS: dict[str, Callable[[], Executor]] = {"fio": FioExecutor, "aio": _aio}


@dataclass(frozen=True)
class SweepRequest:
    profile: Profile
    executor: str = "fio"
    out_dir: Path = SWEEPS_DIR / "default"
    fresh: bool = False
    validate: bool = True
    ceiling_bytes_per_s: float | None = None     # known limits of the drive, if any
    drive: dict[str, object] | None = None       # what the trials run on; a journal resumes only on the same
    user_job: UserJob | None = None              # --steps-cmd: training steps of the user's job, not the built-in
    model: str = "tiny"                          # the built-in model the steps run without a user job
    budget_s: float | None = None                # --budget (None: the default, from the first training-step trial)


def check_deepspeed_ops(req: SweepRequest) -> None:
    """A sweep that will load DeepSpeed's ops refuses to start on a left-over
    build lock: each trial would wait on it until its time limit."""
    loads_ops = req.executor == "aio" or req.profile.run.confirm_top > 0 or req.validate
    problem = stale_lock_problem() if loads_ops else None
    if problem:
        raise UsageError(problem)


def environment(target: Target, executor: str, drive: dict[str, object] | None,
                user_job: UserJob | None = None) -> SweepEnv:
    def version(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return SweepEnv(kernel=platform.release(), target=str(target.directory), executor=executor,
                    drive=dict(drive or {"path": str(target.directory)}),
                    fio=version(["fio", "--version"]) if shutil.which("fio") else "",
                    file_bytes=target.file_bytes, files=target.files, runtime_s=target.runtime_s,
                    started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    steps_cmd=user_job.identity() if user_job else {}, iotune_version=__version__)


def search(measurer: Measurer, space: SearchSpace, settings: RunSettings) -> list[Ranked]:
    """Propose -> measure until the search is done; the executor's ranking."""
    name = measurer.executor.name
    proposals = propose(space, settings, name)
    proposal = next(proposals, None)
    while proposal is not None:
        measurer.measure_all(proposal)
        try:
            proposal = proposals.send(tuple(measurer.journal.trials))   # what was measured so far
        except StopIteration:
            proposal = None
    return rank(summarize_trials(measurer.journal.trials, name))


def run_sweep(req: SweepRequest, target: Target, on_trial: Callable[[Progress], None] | None = None,
              say: Callable[[str], None] = lambda s: None) -> SweepOutcome:
    check_target(target.directory)
    check_deepspeed_ops(req)
    budget = AioBudget(clock_for(req.budget_s), req.profile.run.confirm_pairs,
                       len(thread_values(req.profile.space.omp_threads)), say)
    env = environment(target, req.executor, req.drive, req.user_job)
    journal = open_journal(req.out_dir, req.fresh, env, say)
    before = len(journal.trials)
    space, run = req.profile.space, req.profile.run
    measurer = Measurer(EXECUTORS[req.executor](), target, journal, on_trial, planned_trials(space, run))
    ranking = search(measurer, space, run)
    reference = default_point(space)
    if run.confirm_top > 0 or req.validate:
        unbuilt = ops_to_build()
        if unbuilt:
            say(f"DeepSpeed's {' and '.join(unbuilt)} op{'s are' if len(unbuilt) > 1 else ' is'} not built for "
                f"this install yet: the first training step run builds "
                f"{'them' if len(unbuilt) > 1 else 'it'} (minutes on a small machine, once; nothing is "
                f"printed meanwhile)")
    steps = training_steps(req, target, say)
    try:
        confirmed, step_gain, replay = rank_and_confirm(ranking, reference, run, steps,
                                                        Stage(target, journal, on_trial, say, budget))
        recommended = pick(ranking, confirmed, step_gain, reference, on_replay=replay is not None and replay.ranked,
                           steps_stopped=budget.stopped() == "budget")
        confirm_error = steps_failure(confirmed, journal.trials, steps.name)
        # the thread table runs whenever a training-step stage is configured, also when no candidate
        # besides DeepSpeed's defaults was left to confirm (then it is the defaults' table)
        threads = (sweep_threads(recommended, space.omp_threads, steps, target, journal, on_trial, say, budget)
                   if recommended is not None and not confirm_error and run.confirm_top > 0 else [])
        fragment = ds_fragment(recommended, str(target.directory)) if recommended else {}
        # checked while the steps' warm-start server (if any) is up: DeepSpeed is loaded there already
        error = (validate_with_deepspeed(fragment, warm=getattr(steps, "warm", None))
                 if recommended and req.validate else None)
    finally:
        for note in getattr(steps, "notes", []):
            say(note)
        close = getattr(steps, "close", None)
        if close is not None:
            close()
    return SweepOutcome(
        target=str(target.directory), profile=req.profile.name, executor=req.executor, ranking=ranking,
        confirmed=confirmed, recommended=recommended,
        default=next((r for r in ranking if r.point.key() == reference.key()), None),
        ceiling_bytes_per_s=req.ceiling_bytes_per_s,
        ceiling_source="known drive limits" if req.ceiling_bytes_per_s else "",
        fragment=fragment, validation_error=error, trials=len(journal.trials),
        trials_run_now=len(journal.trials) - before,
        failed=sum(t.status != "ok" for t in journal.trials), journal=str(journal.path), step_gain=step_gain,
        confirm_error=confirm_error, threads=threads, omp_threads_best=best_threads(threads), replay=replay,
        plan=budget.plan, stopped=budget.stopped(), undecided=tuple(budget.clock.undecided),
    )


def rank_and_confirm(ranking: list[Ranked], reference: SweepPoint, run: RunSettings, steps: Executor,
                     stage: Stage) -> tuple[list[Ranked], StepGain | None, ReplayRanking | None]:
    """(confirmed rows, the real steps' verdict, the replay stage): the finalists ranked on the replay
    of the job's own swap I/O, then only the replay's pick on real steps; every finalist on real steps
    when the replay cannot rank (said why), and without a replay stage (replay_pairs 0, or an executor
    that cannot record the job's swap I/O)."""
    candidates = finalists(ranking, reference, run.confirm_top)

    def confirm(chosen: list[SweepPoint] | None = None) -> tuple[list[Ranked], StepGain | None]:
        return confirm_on_steps(ranking, reference, run, stage.target, stage.journal, stage.on_trial, stage.say,
                                steps, chosen, stage.budget)

    if run.confirm_top <= 0 or not candidates or run.replay_pairs <= 0 or not can_record(steps):
        return (*confirm(), None)
    rule = SequentialRule(noise_floor=run.noise_floor, max_pairs=run.replay_pairs)
    replay = rank_on_replay(candidates, reference, steps, rule, stage)
    if not replay.ranked:
        stage.say(f"replay: {replay.fallback}")
        return (*confirm(), replay)
    stage.say(f"replay: {replay.pick_line()}")
    if replay.pick is None:
        return [], None, replay
    return (*confirm([replay.pick]), replay)


def training_steps(req: SweepRequest, target: Target, say: Callable[[str], None]) -> Executor:
    """The executor of real training steps: the user's job or the built-in workload."""
    run = req.profile.run
    if req.user_job is None:
        return StepsExecutor(steps=run.steps, size=req.model, timeout_s=run.steps_timeout_s)
    say(swap_note(req.user_job, target.directory))
    return CommandExecutor(req.user_job)


def steps_failure(confirmed: list[Ranked], trials: list[Trial], executor: str) -> str:
    """When training steps were run and none could be measured: why (the
    first failed trial's error), so the outcome says so; else ""."""
    if not confirmed or any(r.scores for r in confirmed):
        return ""
    keys = {r.point.key() for r in confirmed}
    errors = [t.error for t in trials if t.executor == executor and t.status != "ok" and t.point.key() in keys]
    return f"every training-step trial failed ({executor}); the first: {errors[0] if errors else 'no trial ran'}"
