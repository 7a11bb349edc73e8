"""host.proc: the one way iotune runs system commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from iotune.host.proc import (last_line, not_installed, prefer_interpreter_tools, run, run_in_own_group,
                                 running, terminate)
from iotune.errors import IotuneError


def test_last_line_skips_blank_lines_and_decodes_bytes() -> None:
    assert last_line("a\nb\n\n  \n") == "b"
    assert last_line(b"x\n\xff oops\n") == "\ufffd oops"
    assert last_line("", "no message") == "no message"


def test_run_names_the_command_and_its_last_error_line() -> None:
    assert run(["sh", "-c", "echo out"]) == "out\n"
    with pytest.raises(IotuneError, match=r"^`sh -c echo detail >&2; exit 3` failed: detail$"):
        run(["sh", "-c", "echo detail >&2; exit 3"])
    with pytest.raises(IotuneError) as e:
        run(["iotune-no-such-tool"])
    assert str(e.value) == not_installed("iotune-no-such-tool")
    assert str(e.value) == "iotune-no-such-tool is not installed: run scripts/setup.sh or `iotune doctor --fix`"


def test_a_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    """The shell's child (a long sleep) is gone when the timeout is raised,
    not left to finish on its own."""
    pid_file = tmp_path / "sleep.pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_own_group(["sh", "-c", f"sleep 3600 & echo $! > {pid_file}; wait"], timeout_s=1.0)
    pid = int(pid_file.read_text())
    assert not running(pid), f"the grandchild {pid} survived its group being killed"


def ready_child(script: str, **kwargs: object) -> subprocess.Popen[str]:
    """`sh -c script` that prints "ready" once its traps are set; returned after that line."""
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, **kwargs)  # type: ignore[call-overload]
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("group", [False, True], ids=["process", "group"])
def test_terminate_sends_sigterm_then_sigkill_and_reaps(group: bool) -> None:
    polite = ready_child("trap 'exit 7' TERM; echo ready; while :; do sleep 1; done", start_new_session=group)
    assert terminate(polite, 30.0, group=group) is False            # it left on SIGTERM, long before 30 s
    assert polite.returncode == 7
    stubborn = ready_child("trap '' TERM; echo ready; while :; do sleep 1; done", start_new_session=group)
    assert terminate(stubborn, 0.2, group=group) is True             # SIGTERM ignored: killed
    assert stubborn.returncode == -signal.SIGKILL
    assert terminate(stubborn, 0.2, group=group) is False            # already gone: nothing sent


def test_interpreter_tools_come_first_on_path() -> None:
    here = os.path.dirname(os.path.abspath(sys.executable))
    env = {"PATH": os.pathsep.join(["/usr/bin", here, "/bin"])}
    prefer_interpreter_tools(env)
    assert env["PATH"].split(os.pathsep) == [here, "/usr/bin", "/bin"]
    env = {}
    prefer_interpreter_tools(env)
    assert env["PATH"] == here


def test_this_suite_runs_with_the_interpreter_tools_first() -> None:
    """conftest: DeepSpeed children build ops with this venv's ninja, never another."""
    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(os.path.abspath(sys.executable))
