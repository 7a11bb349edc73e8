"""Progress on stderr: the demo's training steps and a sweep's trials, as a
live bar on a terminal and as plain lines (one per finished step or trial,
no escape codes) elsewhere; the step records a job logs, followed while it
runs; the last lines of a failed job's output."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from iotune.host.proc import tail_lines
from iotune.model.steps import STEP_PREFIX, StepFollower, StepProgress
from iotune.model.sweep import Measurement, SweepPoint, Trial
from iotune.model.sweep_result import Progress, Running
from iotune.render.progress import clock, step_progress, steps_eta_s, sweep_progress, trials_eta_s
from iotune.sweep.executor import Target, TrialFailed
from iotune.sweep.journal import Journal
from iotune.sweep.measure import Measurer

ESCAPE = re.compile(r"\x1b\[")
POINT = SweepPoint(block_size=512 << 10, queue_depth=8, intra_op_parallelism=2)


def plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=60), out


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=160), out


def test_clock_and_etas() -> None:
    assert [clock(s) for s in (0, 0.5, 4.4, 65, 3725, -3)] == ["0:00", "0:01", "0:04", "1:05", "1:02:05", "0:00"]
    # the first step carries start-up work: the median of the others sets the pace
    assert steps_eta_s([], 0, 8) is None
    assert steps_eta_s([9.0], 1, 8) == 63.0
    assert steps_eta_s([9.0, 1.0, 3.0, 2.0], 4, 8) == 8.0
    assert trials_eta_s([], 0, 12) is None
    assert trials_eta_s([2.0, 4.0], 2, 12) == 30.0


def test_plain_step_lines_one_per_finished_step() -> None:
    console, out = plain()
    with step_progress("training", console) as tell:
        tell(StepProgress(0, 3))                  # started: no line
        tell(StepProgress(1, 3, 5.0, 10.37251))
        tell(StepProgress(1, 3, 5.0, 10.37251))   # told twice: one line
        tell(StepProgress(2, 3, 1.5, 10.2))
        tell(StepProgress(3, 3, 1.25, 10.1))
    assert out.getvalue().splitlines() == [       # wider than the console's 60 columns, and not wrapped
        "training step 1/3: loss 10.3725, step 5.000 s, ETA 0:10",
        "training step 2/3: loss 10.2000, step 1.500 s, ETA 0:02",
        "training step 3/3: loss 10.1000, step 1.250 s, ETA 0:00",
    ]


def test_a_step_without_a_loss_leaves_it_out() -> None:
    console, out = plain()
    with step_progress("job", console) as tell:
        tell(StepProgress(1, 2, 0.5))
    assert out.getvalue() == "job step 1/2: step 0.500 s, ETA 0:01\n"


def test_terminal_step_bar_shows_step_loss_time_and_eta() -> None:
    console, out = terminal()
    with step_progress("training", console) as tell:
        tell(StepProgress(0, 8))
        tell(StepProgress(1, 8, 4.0, 10.5))
        tell(StepProgress(2, 8, 2.0, 10.25))
    text = out.getvalue()
    assert ESCAPE.search(text)
    assert "training" in text and "step 2/8 · loss 10.2500 · 2.000 s/step" in text
    assert re.search(r"ETA 0:1[12]", text), text      # 6 steps at 2 s, counting down from the last step


def test_no_step_no_bar() -> None:
    """The fio demo tells no steps: nothing is drawn."""
    console, out = terminal()
    with step_progress("training", console):
        pass
    assert out.getvalue() == ""


def _trial(status: str = "ok", seconds: float = 10.0, raw: dict[str, Any] | None = None,
           executor: str = "steps") -> Trial:
    m = Measurement(step_s=0.5, optimizer_step_s=0.25) if status == "ok" else None
    return Trial(executor, POINT, 0, status, m, "" if status == "ok" else "training failed (exit 1): boom",
                 "", seconds, raw or {})


def test_plain_sweep_lines_one_per_finished_trial_with_eta() -> None:
    console, out = plain()
    with sweep_progress(console) as tell:
        tell(Progress(0, 4, None, running=Running("steps", POINT, 0)))
        tell(Progress(0, 4, None, running=Running("steps", POINT, 0, StepProgress(1, 6, 0.5, 10.0))))
        tell(Progress(1, 4, _trial(seconds=10.0)))
        tell(Progress(2, 4, _trial(seconds=0.0), reused=True))       # from the journal: costs nothing
        tell(Progress(3, 4, _trial(seconds=20.0)))
        tell(Progress(4, 4, _trial(seconds=15.0)))
    assert out.getvalue().splitlines() == [
        "[1/4] steps bs=512 KiB qd=8 t=2 rep 0: step 0.500 s, optimizer 0.250 s (ETA 0:30)",
        "[2/4] steps bs=512 KiB qd=8 t=2 rep 0: reused (ETA 0:20)",
        "[3/4] steps bs=512 KiB qd=8 t=2 rep 0: step 0.500 s, optimizer 0.250 s (ETA 0:15)",
        "[4/4] steps bs=512 KiB qd=8 t=2 rep 0: step 0.500 s, optimizer 0.250 s",
    ]


def test_a_failed_trial_shows_its_output_tail_once_per_stage() -> None:
    stderr = "".join(f"line {i}\n" for i in range(1, 61)) + "RuntimeError: boom\n"
    console, out = plain()
    with sweep_progress(console) as tell:
        tell(Progress(1, 3, _trial("failed", raw={"stderr": stderr})))
        tell(Progress(2, 3, _trial("failed", raw={"stderr": stderr})))
        tell(Progress(3, 3, _trial("failed", raw={"stderr_tail": "cmd: out of memory\n"}, executor="cmd")))
    lines = out.getvalue().splitlines()
    header = "--- the last 40 lines of the failed steps trial's stderr (kept in the sweep's journal) ---"
    assert lines[0] == "[1/3] steps bs=512 KiB qd=8 t=2 rep 0: failed: training failed (exit 1): boom (ETA 0:20)"
    assert lines[1] == header
    assert lines[2:42] == [f"line {i}" for i in range(22, 61)] + ["RuntimeError: boom"]
    assert lines[42] == "--- end of the failed steps trial's stderr (kept in the sweep's journal) ---"
    assert lines[43].startswith("[2/3] steps ") and lines[44].startswith("[3/3] cmd ")     # the same stage: no tail
    assert lines[45:] == ["--- the last 1 line of the failed cmd trial's stderr (kept in the sweep's journal) ---",
                          "cmd: out of memory",
                          "--- end of the failed cmd trial's stderr (kept in the sweep's journal) ---"]


def test_terminal_sweep_bar_names_the_running_point_and_its_steps() -> None:
    console, out = terminal()
    with sweep_progress(console) as tell:
        tell(Progress(0, 4, None, running=Running("fio", POINT, 0)))
        tell(Progress(1, 4, _trial(seconds=3.0, executor="fio")))
        tell(Progress(1, 4, None, running=Running("steps", POINT, 1)))
        tell(Progress(1, 4, None, running=Running("steps", POINT, 1, StepProgress(0, 6))))
        tell(Progress(1, 4, None, running=Running("steps", POINT, 1, StepProgress(2, 6, 0.75, 9.5))))
    text = out.getvalue()
    assert "steps bs=512 KiB qd=8 t=2 rep 1" in text and "1/4" in text
    assert "step 2/6 · loss 9.5000 · 0.750 s/step" in text


def test_step_follower_reads_whole_records_as_they_are_logged(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    seen: list[StepProgress] = []
    follow = StepFollower(log, 3, seen.append)
    follow.poll()                                     # no log yet
    record = {"step": 1, "loss": 6.5, "step_s": 0.25, "optimizer_step_s": 0.125}
    line = STEP_PREFIX + json.dumps(record) + "\n"
    log.write_text("[WARNING] DeepSpeed says something\n" + line[:20])
    follow.poll()                                     # half a record: not yet
    with log.open("a") as fh:
        fh.write(line[20:] + "more output\n" + line.replace('"step": 1', '"step": 2'))
    follow.poll()
    follow.poll()
    assert seen == [StepProgress(0, 3), StepProgress(1, 3, 0.25, 6.5), StepProgress(2, 3, 0.25, 6.5)]


def test_tail_lines(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    assert tail_lines(log, 40) == []
    log.write_text("".join(f"{i}\n" for i in range(100)))
    assert tail_lines(log, 3) == ["97", "98", "99"]
    assert tail_lines(log, 3, max_bytes=9) == ["97", "98", "99"]
    assert tail_lines(log, 3, max_bytes=8) == ["98", "99"]       # "7\n98\n99\n": the cut line is left out


class Training:
    """An executor whose trial reports two training steps, as the steps executor does."""

    name = "steps"

    def run(self, point: SweepPoint, target: Target) -> tuple[Measurement, dict[str, Any]]:
        assert target.on_step is not None
        for p in (StepProgress(0, 2), StepProgress(1, 2, 1.0, 7.0), StepProgress(2, 2, 0.5, 6.0)):
            target.on_step(p)
        if point.queue_depth == 4:
            raise TrialFailed("training failed (exit 1): boom", {"stderr": "boom\n"})
        return Measurement(step_s=0.5), {}


def test_measurer_tells_the_start_each_step_and_the_end_of_a_trial(tmp_path: Path) -> None:
    told: list[Progress] = []
    measurer = Measurer(Training(), Target(tmp_path), Journal(tmp_path / "journal.jsonl"), told.append, planned=2)
    measurer.measure(POINT)
    failing = SweepPoint(queue_depth=4)
    measurer.measure(failing)
    measurer.measure(POINT)                           # already measured in this run: nothing told
    assert [(p.done, p.planned, p.running) for p in told if p.trial is None] == [
        (0, 2, Running("steps", POINT, 0)),
        (0, 2, Running("steps", POINT, 0, StepProgress(0, 2))),
        (0, 2, Running("steps", POINT, 0, StepProgress(1, 2, 1.0, 7.0))),
        (0, 2, Running("steps", POINT, 0, StepProgress(2, 2, 0.5, 6.0))),
        (1, 2, Running("steps", failing, 0)),
        (1, 2, Running("steps", failing, 0, StepProgress(0, 2))),
        (1, 2, Running("steps", failing, 0, StepProgress(1, 2, 1.0, 7.0))),
        (1, 2, Running("steps", failing, 0, StepProgress(2, 2, 0.5, 6.0))),
    ]
    ended = [p for p in told if p.trial is not None]
    assert [(p.done, p.trial.point, p.trial.status) for p in ended] == [(1, POINT, "ok"), (2, failing, "failed")]
    assert [i for i, p in enumerate(told) if p.trial is not None] == [4, 9]
