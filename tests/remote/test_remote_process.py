"""remote.process.RemoteProcess, the one way a node's command is run, read and
stopped, through a transport that runs the command right here (what ssh and
srun add on top is tested on the node and Slurm beds in test_fleet_*)."""

from __future__ import annotations

import os
import time
import sys
from collections.abc import Sequence
from pathlib import Path

from iotune.host.proc import last_line, running
from iotune.remote.process import TAIL_LINES, RemoteProcess

PY = sys.executable


class Here:
    """A transport without the hop: the command runs on this machine."""

    name = "here"

    def argv(self, host: str, remote_argv: Sequence[str]) -> list[str]:
        return list(remote_argv)

    def last_message(self, stderr: str) -> str:
        return last_line(stderr, "no message")

    def error(self, host: str, code: int | None, tail: str, remote_iotune: str) -> str | None:
        return None

    def node_check(self, host: str, reported: str | None) -> str:
        return ""


def test_stdout_whole_and_stderr_lines_passed_on_with_the_host() -> None:
    said: list[str] = []
    script = ("import sys\n"
              "sys.stdout.buffer.write(b'{\"ready\": 1}\\n' + bytes(range(256)) * 1000)\n"
              "for i in range(30): print(f'line {i}', file=sys.stderr)\n"
              "sys.exit(3)\n")
    with RemoteProcess.running("n1", [PY, "-c", script], Here(), say=said.append) as p:
        assert p.wait(60) == 3
        assert p.stdout == b'{"ready": 1}\n' + bytes(range(256)) * 1000
        assert said == [f"n1: line {i}" for i in range(30)]
        assert p.last == "line 29"
        assert p._tail == [f"line {i}" for i in range(30 - TAIL_LINES, 30)]
        assert p.first_line_at is not None and p.eof_at is not None and p.started_at <= p.first_line_at <= p.eof_at


def test_closing_stdin_is_the_stop_signal() -> None:
    script = "import sys\nsys.stdin.read()\nprint('stopped')\n"
    with RemoteProcess.running("n1", [PY, "-c", script], Here(), stdin=True) as p:
        assert not p.exited
        p.close_stdin()
        assert p.wait(60) == 0
        assert p.stdout == b"stopped\n"


def test_a_timeout_kills_the_whole_session_grandchildren_too(tmp_path: Path) -> None:
    """The command starts a grandchild that ignores SIGTERM and would outlive
    a kill of the command alone; both are gone once wait gives up."""
    pid_file = tmp_path / "grandchild"
    grandchild = tmp_path / "grandchild.py"
    grandchild.write_text("import os, signal, sys, time\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                          "print('started', flush=True)\n"
                          "while True:\n    time.sleep(1)\n")
    command = tmp_path / "command.py"
    command.write_text(f"import subprocess\nsubprocess.run([{PY!r}, {str(grandchild)!r}])\n")
    with RemoteProcess.running("n1", [PY, str(command)], Here()) as p:
        while b"started" not in p.stdout:
            assert not p.exited, p.last
            time.sleep(0.01)    # polling for its line
        assert p.wait(0.5) is None
        assert p.exited and p.returncode is not None
    pid = int(pid_file.read_text())
    assert not running(pid), f"grandchild {pid} still running"
