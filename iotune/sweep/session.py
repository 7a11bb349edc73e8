"""One `iotune sweep`: target, journal, search, confirmation with training
steps, recommendation and its validation by DeepSpeed."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..analysis.sweep import rank, summarize_trials
from ..model.sweep_result import Progress, SweepOutcome
from ..blockdev.directio import direct_io_problem
from ..errors import UsageError
from ..model.sweep import SweepPoint
from .executor import Executor, Target
from .fio_executor import FioExecutor
from .journal import Journal
from .recommend import ds_fragment, validate_with_deepspeed
from .search import Sweeper
from .space import Profile
from .steps_executor import StepsExecutor

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


def open_journal(out_dir: Path, fresh: bool) -> Journal:
    path = out_dir / "journal.jsonl"
    if fresh and path.exists():
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path.rename(path.with_name(f"journal.{stamp}.jsonl"))     # kept, never deleted
    return Journal(path)


def environment(target: Target, executor: str, drive: dict[str, object] | None) -> dict[str, object]:
    def version(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {"kernel": platform.release(), "target": str(target.directory), "executor": executor,
            "drive": drive or {"path": str(target.directory)},
            "fio": version(["fio", "--version"]) if shutil.which("fio") else "",
            "file_bytes": target.file_bytes, "files": target.files, "runtime_s": target.runtime_s,
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def run_sweep(req: SweepRequest, target: Target, on_trial: Callable[[Progress], None] | None = None,
              say: Callable[[str], None] = lambda s: None) -> SweepOutcome:
    check_target(target.directory)
    journal = open_journal(req.out_dir, req.fresh)
    env = environment(target, req.executor, req.drive)
    recorded = journal.header.get("env", {})
    for key in ("drive", "executor", "file_bytes", "files", "runtime_s"):
        if journal.header and recorded.get(key) != env[key]:
            raise UsageError(f"the journal in {req.out_dir} was recorded with {key} {recorded.get(key)!r}, not "
                             f"{env[key]!r}: resume with the same settings, or use --fresh or another --out")
    journal.start(env)
    before = len(journal.trials)
    sweeper = Sweeper(EXECUTORS[req.executor](), target, req.profile.space, req.profile.run, journal, on_trial)
    ranking = sweeper.run()
    default_key = sweeper.default_point().key()
    default = next((r for r in ranking if r.point.key() == default_key), None)
    confirmed = confirm(req, target, journal, ranking, sweeper.default_point(), on_trial, say)
    recommended = pick(ranking, confirmed, sweeper.default_point())
    fragment = ds_fragment(recommended, str(target.directory)) if recommended else {}
    error = validate_with_deepspeed(fragment) if recommended and req.validate else None
    return SweepOutcome(
        target=str(target.directory), profile=req.profile.name, executor=req.executor, ranking=ranking,
        confirmed=confirmed, recommended=recommended, default=default,
        ceiling_bytes_per_s=req.ceiling_bytes_per_s,
        ceiling_source="known drive limits" if req.ceiling_bytes_per_s else "",
        fragment=fragment, validation_error=error, trials=len(journal.trials),
        trials_run_now=len(journal.trials) - before,
        failed=sum(t.status != "ok" for t in journal.trials), journal=str(journal.path),
    )


def confirm(req: SweepRequest, target: Target, journal: Journal, ranking: list, default: SweepPoint,
            on_trial: Callable[[Progress], None] | None, say: Callable[[str], None]) -> list:
    """Closed loop: the top candidates and DeepSpeed's default, on real
    training steps (nvme-opt, optimizer state swapped to the target)."""
    n = req.profile.run.confirm_top
    if n <= 0:
        return []
    candidates = [r.point for r in ranking[:n] if r.scores]
    points = list(dict.fromkeys(candidates + [default]))
    say(f"confirming {len(candidates)} candidate(s) and DeepSpeed's defaults with "
        f"{req.profile.run.steps} training steps each")
    steps = Sweeper(StepsExecutor(steps=req.profile.run.steps), target, req.profile.space, req.profile.run,
                    journal, on_trial)
    steps.planned = len(points)
    for p in points:
        steps.measure(p)
    return rank(summarize_trials(journal.trials, "steps"))


def pick(ranking: list, confirmed: list, default: SweepPoint) -> SweepPoint | None:
    """The confirmed winner if training steps were run (ties inside the noise
    go to the cheaper point, DeepSpeed's default included), else the
    executor's best."""
    if confirmed and confirmed[0].scores:
        return confirmed[0].point
    return ranking[0].point if ranking and ranking[0].scores else None
