"""The agents of a multi-node trace as seen from the gathering host: one
local process per node running `iotune agent ...` there through a transport
(`ssh HOST`, or `srun --nodelist NODE` inside a Slurm allocation:
remote.ssh, remote.slurm), its stdout read by a thread (the ready
line, later the run as a tar stream), its stderr's last lines kept for the
error messages (remote.process). trace.fleet drives them; trace.agent is the other end."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..remote.process import RemoteProcess
from ..remote.ssh import Transport, ssh_connection_lost
from ..errors import IotuneError
from .agent import READY_KEY, SCHEDULER_NODE_KEY, untar_directory


class Agent(RemoteProcess):
    """One host's agent, started by `Agent.running(host, remote_iotune,
    agent_args, transport)` (a context manager that kills and reaps it
    whatever happens); its stdin stays open until `stop`."""

    def __init__(self, host: str, remote_iotune: str, agent_args: Sequence[str], transport: Transport) -> None:
        super().__init__(host, [remote_iotune, "agent", *agent_args], transport, stdin=True)
        self.remote_iotune = remote_iotune
        self.stopped = False
        self.stop_at: float | None = None      # when it was told to stop

    @property
    def ready(self) -> bool:
        return READY_KEY in self.ready_fields()

    def ready_fields(self) -> dict[str, object]:
        """The agent's ready line ({} before it arrived)."""
        line, sep, _ = self.stdout.partition(b"\n")
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

    def stop(self) -> None:
        """Close the agent's stdin: it stops tracing and sends its run."""
        self.stopped = True
        self.stop_at = time.monotonic()
        self.close_stdin()

    def died_message(self) -> str:
        tail = self.last
        if self.transport.name == "ssh" and ssh_connection_lost(self.proc.returncode, tail):
            return f"the ssh connection to it was lost before the command ended ({tail})"
        return f"the agent exited (status {self.proc.returncode}) before the command ended: {tail}"

    def late_error(self) -> str:
        """What went wrong after the agent sent its run ("" if nothing)."""
        code = self.proc.returncode
        return "" if code == 0 else f"the agent exited with status {code} after sending its run: {self.last}"

    def run_bytes(self) -> bytes:
        """What came after the ready line: the run, as a tar stream."""
        return self.stdout.partition(b"\n")[2]

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
    ready = agent.first_line_at - agent.started_at if agent.first_line_at is not None else None
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
    tail = agent.last
    if code is None:
        return f"host {host}: the agent did not report ready within {timeout_s:g} s (last message: {tail})"
    return (agent.transport.error(host, code, tail, agent.remote_iotune)
            or f"host {host}: the agent failed (status {code}): {tail}")
