"""Progress displays for long work, on stderr (stdout carries the report
only): the trials of a sweep, and the steps of a training job (the demo's,
a sweep's training trials).

On a terminal: live bars with an ETA, gone when the work ends. Elsewhere (a
pipe, a CI log, a file): plain lines, at most one per finished step or
trial, without colour or cursor movement."""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

from ..model import units
from ..model.steps import StepProgress
from ..model.sweep import SweepPoint, Trial
from ..model.sweep_result import Progress as TrialProgress

TAIL_LINES = 40        # of a failed job's log


def clock(s: float) -> str:
    """A duration as a clock: 5 -> '0:05', 125 -> '2:05', 3725 -> '1:02:05'."""
    h, rest = divmod(max(0, int(s + 0.5)), 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def steps_eta_s(step_times: Sequence[float], done: int, total: int) -> float | None:
    """Seconds left for the total - done steps to come, at the median time
    of the steps after the first (the first carries one-off start-up work);
    None before a step finished."""
    if not step_times:
        return None
    typical = statistics.median(step_times[1:] if len(step_times) > 1 else step_times)
    return typical * max(0, total - done)


def trials_eta_s(seconds: Sequence[float], done: int, planned: int) -> float | None:
    """Seconds left for the planned - done trials to come, at the mean time
    of the trials run so far (those taken from the journal cost nothing);
    None before one ran."""
    if not seconds:
        return None
    return statistics.fmean(seconds) * max(0, planned - done)


def step_line(label: str, p: StepProgress, eta_s: float | None) -> str:
    """One finished step as a plain line:
    'training step 3/8: loss 10.3725, step 0.512 s, ETA 0:03'."""
    parts = [] if p.loss is None else [f"loss {p.loss:.4f}"]
    if p.step_s is not None:
        parts.append(f"step {units.step_time(p.step_s)}")
    if eta_s is not None:
        parts.append(f"ETA {clock(eta_s)}")
    return f"{label} step {p.done}/{p.total}" + (": " + ", ".join(parts) if parts else "")


def trial_line(p: TrialProgress, eta_s: float | None) -> str:
    """One finished trial as a plain line:
    '[3/12] fio bs=512 KiB qd=8 t=1 rep 0: read 190.2 MB/s, write 180.0 MB/s (ETA 1:05)'."""
    t = p.trial
    if t is None:
        return ""
    what = "reused" if p.reused else ("failed: " + t.error if t.status != "ok" else _result(t))
    eta = f" (ETA {clock(eta_s)})" if eta_s is not None and p.done < p.planned else ""
    return f"[{p.done}/{p.planned}] {t.executor} {_point(t.point)} {_repeat(t.repeat)}: {what}{eta}"


def _repeat(repeat: int) -> str:
    """"rep N"; a trial outside the pairs (repeat < 0) by its role: the real run at the defaults
    that recorded the job's swap I/O."""
    return f"rep {repeat}" if repeat >= 0 else "recording swap I/O"


def log_tail(lines: Sequence[str], where: str) -> str:
    """A failed job's last lines, between rules naming where all of it is."""
    n = len(lines)
    return "\n".join([f"--- the last {n} line{'s' * (n != 1)} of {where} ---", *lines, f"--- end of {where} ---"])


class StepClock:
    """The steps of one job seen so far: the time of each, for the ETA."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.done = 0
        self.at = time.monotonic()          # when the last step finished

    def add(self, p: StepProgress) -> bool:
        """Take `p` in; True when it is a step not seen before (not the job's
        start, not a repeat)."""
        if p.done == 0:
            self.times, self.done, self.at = [], 0, time.monotonic()
            return False
        if p.done <= self.done:
            return False
        self.done, self.at = p.done, time.monotonic()
        if p.step_s is not None:
            self.times.append(p.step_s)
        return True

    def eta_s(self, total: int) -> float | None:
        return steps_eta_s(self.times, self.done, total)

    def due(self, total: int) -> float | None:
        """When the job should be done (time.monotonic()), or None."""
        eta = self.eta_s(total)
        return None if eta is None else self.at + eta


class TrialClock:
    """The trials of each stage (executor) run so far: their times, for the ETA."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}
        self.due: float | None = None         # when the current stage should be done (time.monotonic())

    def add(self, p: TrialProgress) -> float | None:
        """Take a finished trial in; seconds left for its stage (None: not known yet)."""
        t = p.trial
        if t is None:
            return None
        runs = self.seconds.setdefault(t.executor, [])
        if not p.reused:
            runs.append(t.seconds)
        eta = trials_eta_s(runs, p.done, p.planned)
        self.due = None if eta is None else time.monotonic() + eta
        return eta

    def start(self, p: TrialProgress) -> None:
        """A trial starts (`p.running`): the first of a stage (done 0) is due
        at the pace of the trials of its kind so far, or not known."""
        if p.running is None or p.done > 0:
            return
        eta = trials_eta_s(self.seconds.get(p.running.executor, []), 0, p.planned)
        self.due = None if eta is None else time.monotonic() + eta


class _Eta(ProgressColumn):
    """'ETA m:ss', counting down to the task's `due` field (time.monotonic(); None: not known)."""

    def render(self, task: Task) -> Text:
        due = task.fields.get("due")
        return Text("ETA " + ("-:--" if due is None else clock(due - time.monotonic())),
                    style="progress.remaining")


def _bar(console: Console) -> Progress:
    """Text that does not wrap (a narrow terminal shortens the bar, then cuts the text)."""
    def text(template: str) -> TextColumn:
        return TextColumn(template, table_column=Column(no_wrap=True, overflow="ellipsis"))
    return Progress(text("{task.description}"), BarColumn(), text("{task.fields[status]}"),
                    TimeElapsedColumn(), _Eta(), console=console, transient=True, redirect_stdout=False)


def _stderr() -> Console:
    return Console(file=sys.stderr, highlight=False)


def _plain(console: Console, text: str) -> None:
    """A line as it is: no markup, colour or wrapping."""
    console.file.write(text + "\n")
    console.file.flush()


def _step_status(p: StepProgress) -> str:
    parts = [f"step {p.done}/{p.total}"]
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    if p.step_s is not None:
        parts.append(f"{units.step_time(p.step_s)}/step")
    return " · ".join(parts) if p.done else f"starting ({p.total} steps)"


@contextlib.contextmanager
def step_progress(label: str, console: Console | None = None) -> Iterator[Callable[[StepProgress], None]]:
    """A callback for one training job's steps: on a terminal a live bar
    (step n/N, loss, step time, ETA) from the job's start on; otherwise one
    plain line per finished step."""
    console = console or _stderr()
    steps = StepClock()
    if not console.is_terminal:
        def line(p: StepProgress) -> None:
            if steps.add(p):
                _plain(console, step_line(label, p, steps.eta_s(p.total)))
        yield line
        return
    bar = _bar(console)
    task: TaskID | None = None

    def update(p: StepProgress) -> None:
        nonlocal task
        steps.add(p)
        if task is None:
            bar.start()
            task = bar.add_task(label, total=None, status="", due=None)      # a pulse until a step finished
        bar.update(task, completed=p.done, total=p.total if p.done else None, status=_step_status(p),
                   due=steps.due(p.total))
    try:
        yield update
    finally:
        bar.stop()


@contextlib.contextmanager
def sweep_progress(console: Console | None = None) -> Iterator[Callable[[TrialProgress], None]]:
    """A callback for a sweep's progress. On a terminal: a bar of the
    stage's trials (the one running, n/N, ETA) and, while a training trial
    runs, one of its steps (n/N, loss, step time, ETA). Otherwise one plain
    line per finished trial, with the stage's ETA. The first failed trial of
    each stage also shows the last lines of the output its executor kept
    (a training job's stderr)."""
    console = console or _stderr()
    trials, tails = TrialClock(), FailureTails()
    if not console.is_terminal:
        def line(p: TrialProgress) -> None:
            if p.trial is not None:
                _plain(console, trial_line(p, trials.add(p)))
                tails.show(p.trial, lambda text: _plain(console, text))
        yield line
        return
    with _bar(console) as bar:
        task = bar.add_task("sweep", total=None, status="", due=None)
        steps_task = bar.add_task("", total=None, status="", due=None, visible=False)
        steps = StepClock()

        def update(p: TrialProgress) -> None:
            if p.trial is not None:
                trials.add(p)
                bar.update(steps_task, visible=False)
                tails.show(p.trial, lambda text: console.print(Text(text), soft_wrap=True))
            elif p.running is not None and p.running.steps is None:
                trials.start(p)
                bar.update(task, description=f"{p.running.executor} {_point(p.running.point)} "
                                             f"{_repeat(p.running.repeat)}")
            elif p.running is not None and p.running.steps is not None:
                s = p.running.steps
                steps.add(s)
                if s.done == 0:
                    bar.reset(steps_task, visible=True)
                bar.update(steps_task, completed=s.done, total=s.total, description="  " + _step_status(s),
                           due=steps.due(s.total))     # in the wide column: the trials' status is short
            bar.update(task, completed=p.done, total=p.planned, status=f"{p.done}/{p.planned}", due=trials.due)
        yield update


class FailureTails:
    """The last lines of a failed trial's output, once per stage
    (executor): the first failure says why; the next ones, in their one
    line, whether it is the same."""

    def __init__(self) -> None:
        self.shown: set[str] = set()

    def show(self, t: Trial, out: Callable[[str], None]) -> None:
        text = str(t.raw.get("stderr") or t.raw.get("stderr_tail") or "") if t.status != "ok" else ""
        if not text.strip() or t.executor in self.shown:
            return
        self.shown.add(t.executor)
        lines = text.rstrip("\n").splitlines()
        if len(text) >= 4000:       # a tail already (executors keep 4000 characters): its first line is cut
            lines = lines[1:]
        out(log_tail(lines[-TAIL_LINES:], f"the failed {t.executor} trial's stderr (kept in the sweep's journal)"))


def _point(p: SweepPoint) -> str:
    return f"bs={units.size(p.block_size)} qd={p.queue_depth} t={p.intra_op_parallelism}" + \
        (" ss" if p.single_submit else "") + ("" if p.overlap_events else " no-overlap")


def _result(t: Trial) -> str:
    m = t.measurement
    if m is None:
        return "-"
    if m.step_s:
        opt = "-" if m.optimizer_step_s is None else f"{m.optimizer_step_s:.3f} s"
        return f"step {m.step_s:.3f} s, optimizer {opt}"
    return f"read {units.rate(m.read_bytes_per_s)} MB/s, write {units.rate(m.write_bytes_per_s)} MB/s"
