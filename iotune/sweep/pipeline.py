"""One `iotune sweep`, as one pipeline that runs one way:

    propose points -> measure (executor + journal) -> rank
        -> confirm on training steps (finalists vs DeepSpeed's defaults,
           alternating pairs) -> recommend (never slower than the defaults
           beyond the measured noise)

Each stage is a module of its own (propose, measure, rank, confirm,
recommend); what passes between them are model records (Proposal, Trial,
Ranked, SweepOutcome). This module checks the target, opens the journal and
runs the stages in that order."""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..blockdev.directio import direct_io_problem
from ..errors import UsageError
from ..model.journal import SweepEnv
from ..model.sweep_result import Progress, Ranked, SweepOutcome
from .confirm import confirm_on_steps
from .executor import Executor, Target
from .fio_executor import FioExecutor
from .journal import open_journal
from .measure import Measurer
from .propose import default_point, planned_trials, propose
from .rank import rank, summarize_trials
from .recommend import ds_fragment, pick, validate_with_deepspeed
from .space import Profile, RunSettings, SearchSpace


def _aio() -> Executor:
    from .aio_executor import AioExecutor   # imports nothing heavy itself; the trials run DeepSpeed

    return AioExecutor()


EXECUTORS: dict[str, Callable[[], Executor]] = {"fio": FioExecutor, "aio": _aio}


@dataclass(frozen=True)
class SweepRequest:
    profile: Profile
    executor: str = "fio"
    out_dir: Path = Path("iotune-sweeps/default")
    fresh: bool = False
    validate: bool = True
    ceiling_bytes_per_s: float | None = None     # known limits of the drive, if any
    drive: dict[str, object] | None = None       # what the trials run on; a journal resumes only on the same


def check_target(directory: Path) -> None:
    if not directory.is_dir():
        raise UsageError(f"--path {directory} is not a directory: create it on the drive to tune")
    problem = direct_io_problem(str(directory))
    if problem:
        raise UsageError(f"--path {directory}: {problem}; DeepSpeed swaps with O_DIRECT, so sweep a "
                         f"directory on ext4, xfs or btrfs on the drive you will use")


def environment(target: Target, executor: str, drive: dict[str, object] | None) -> SweepEnv:
    def version(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return SweepEnv(kernel=platform.release(), target=str(target.directory), executor=executor,
                    drive=dict(drive or {"path": str(target.directory)}),
                    fio=version(["fio", "--version"]) if shutil.which("fio") else "",
                    file_bytes=target.file_bytes, files=target.files, runtime_s=target.runtime_s,
                    started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))


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
    journal = open_journal(req.out_dir, req.fresh)
    env = environment(target, req.executor, req.drive)
    journal.check_resumable(env)
    journal.start(env)
    before = len(journal.trials)
    space, run = req.profile.space, req.profile.run
    measurer = Measurer(EXECUTORS[req.executor](), target, journal, on_trial, planned_trials(space, run))
    ranking = search(measurer, space, run)
    reference = default_point(space)
    confirmed, step_gain = confirm_on_steps(ranking, reference, run, target, journal, on_trial, say)
    recommended = pick(ranking, confirmed, step_gain, reference)
    fragment = ds_fragment(recommended, str(target.directory)) if recommended else {}
    error = validate_with_deepspeed(fragment) if recommended and req.validate else None
    return SweepOutcome(
        target=str(target.directory), profile=req.profile.name, executor=req.executor, ranking=ranking,
        confirmed=confirmed, recommended=recommended,
        default=next((r for r in ranking if r.point.key() == reference.key()), None),
        ceiling_bytes_per_s=req.ceiling_bytes_per_s,
        ceiling_source="known drive limits" if req.ceiling_bytes_per_s else "",
        fragment=fragment, validation_error=error, trials=len(journal.trials),
        trials_run_now=len(journal.trials) - before,
        failed=sum(t.status != "ok" for t in journal.trials), journal=str(journal.path), step_gain=step_gain,
    )
