"""The agents of a multi-node trace as seen from the gathering host: one
local process per node running `iotune agent ...` there through a transport
(`ssh HOST`, or `srun --nodelist NODE` inside a Slurm allocation:
remote.ssh, remote.slurm), its stdout read by a thread (the ready
line, later the run as a tar stream), its stderr kept in a file for the
error messages. trace.fleet drives them; trace.agent is the other end."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..host.proc import terminate
from ..remote.ssh import Transport, ssh_connection_lost
from ..errors import IotuneError
from .agent import READY_KEY, SCHEDULER_NODE_KEY, untar_directory


class Agent:
    """One host's agent, started by `Agent.start` (a context manager that
    kills and reaps it whatever happens)."""

    def __init__(self, host: str, remote_iotune: str, proc: subprocess.Popen[bytes], stderr_path: Path,
                 transport: Transport) -> None:
        self.host = host
        self.transport = transport
        self.remote_iotune = remote_iotune
        self.proc = proc
        self.stderr_path = stderr_path
        self.stopped = False
        self.started_at = time.monotonic()
        self.ready_at: float | None = None     # when the ready line arrived
        self.stop_at: float | None = None      # when it was told to stop
        self.eof_at: float | None = None       # when its stdout ended
        self._out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    @contextlib.contextmanager
    def start(cls, host: str, remote_iotune: str, agent_args: Sequence[str],
              transport: Transport) -> Iterator[Agent]:
        argv = transport.argv(host, [remote_iotune, "agent", *agent_args])
        fd, err = tempfile.mkstemp(prefix="iotune-agent-stderr-")
        try:
            with os.fdopen(fd, "wb") as errfile:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile,
                                        start_new_session=True)
            agent = cls(host, remote_iotune, proc, Path(err), transport)
            try:
                yield agent
            finally:
                agent.kill()
        finally:
            os.unlink(err)

    def _read(self) -> None:
        if self.proc.stdout is None:
            return
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 1 << 16):
            self._out += chunk
            if self.ready_at is None and b"\n" in chunk:
                self.ready_at = time.monotonic()
        self.eof_at = time.monotonic()

    @property
    def ready(self) -> bool:
        return READY_KEY in self.ready_fields()

    def ready_fields(self) -> dict[str, object]:
        """The agent's ready line ({} before it arrived)."""
        line, sep, _ = bytes(self._out).partition(b"\n")
        try:
            fields = json.loads(line) if sep else {}
        except json.JSONDecodeError:
            return {}
        return fields if isinstance(fields, dict) else {}

    def node_error(self) -> str:
        """"" when the agent runs on the node it was started for, as far as
        the transport can tell (srun: its SLURMD_NODENAME); else why not."""
        reported = self.ready_fields().get(SCHEDULER_NODE_KEY)
        return self.transport.node_check(self.host, str(reported) if reported is not None else None)

    @property
    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        """Close the agent's stdin: it stops tracing and sends its run."""
        self.stopped = True
        self.stop_at = time.monotonic()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def kill(self, term_s: float = 3.0) -> None:
        """SIGTERM, then after `term_s` SIGKILL (srun cancels its step on
        SIGTERM; killed outright it would leave the step running)."""
        terminate(self.proc, term_s, group=True)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr_tail(self) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return "no message"
        return self.transport.last_message(text)

    def died_message(self) -> str:
        tail = self.stderr_tail()
        if self.transport.name == "ssh" and ssh_connection_lost(self.proc.returncode, tail):
            return f"the ssh connection to it was lost before the command ended ({tail})"
        return f"the agent exited (status {self.proc.returncode}) before the command ended: {tail}"

    def late_error(self) -> str:
        """What went wrong after the agent sent its run ("" if nothing)."""
        code = self.proc.returncode
        return "" if code == 0 else f"the agent exited with status {code} after sending its run: {self.stderr_tail()}"

    def run_bytes(self) -> bytes:
        """What came after the ready line: the run, as a tar stream."""
        return bytes(self._out).partition(b"\n")[2]

    def unpack_run(self, where: Path) -> Path:
        """The run directory the agent sent, unpacked under `where`; an
        IotuneError saying why there is none."""
        data = self.run_bytes()
        if not self.ready or not data:
            died = self.exited and not self.stopped
            if died or self.proc.returncode not in (0, None):
                raise IotuneError(f"host {self.host}: {self.died_message()}")
            raise IotuneError(f"host {self.host}: the agent sent no run")
        run_dir = where / "run"
        try:
            untar_directory(data, run_dir)
        except Exception as e:   # tarfile raises several kinds for a cut stream
            raise IotuneError(f"host {self.host}: the agent's run arrived incomplete ({e})") from None
        return run_dir


@dataclass(frozen=True)
class AgentCost:
    """What one host's agent cost (the fan-out benchmark reports these)."""

    host: str
    ready_s: float | None        # ssh login + probe compile and attach, until its ready line
    gather_s: float | None       # from the stop until its run had arrived
    run_bytes: int               # the run as sent (tar)


def agent_cost(agent: Agent) -> AgentCost:
    data = agent.run_bytes()
    ready = agent.ready_at - agent.started_at if agent.ready_at is not None else None
    gather = (agent.eof_at - agent.stop_at if agent.eof_at is not None and agent.stop_at is not None
              and agent.eof_at >= agent.stop_at else None)
    return AgentCost(agent.host, ready, gather, len(data))


def stop_agents(agents: Sequence[Agent], timeout_s: float) -> None:
    """Stop every agent (they assemble and send their runs in parallel);
    any still running after `timeout_s` is killed."""
    early = {a.host for a in agents if a.exited}
    for a in agents:
        if a.host not in early:
            a.stop()
    deadline = time.monotonic() + timeout_s
    while not all(a.exited for a in agents) and time.monotonic() < deadline:
        time.sleep(0.05)
    for a in agents:
        if a.host in early:
            a.stopped = False   # it died on its own: unpack_run says so
        a.kill()


def start_error(agent: Agent, timeout_s: float) -> str:
    """Why an agent did not start, naming the host and the fix."""
    host, code = agent.host, agent.proc.returncode
    tail = agent.stderr_tail()
    if code is None:
        return f"host {host}: the agent did not report ready within {timeout_s:g} s (last message: {tail})"
    return (agent.transport.error(host, code, tail, agent.remote_iotune)
            or f"host {host}: the agent failed (status {code}): {tail}")
