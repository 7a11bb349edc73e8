"""A multi-node trace: an agent (`iotune agent`, trace.agent) on every host
traces that host's devices while a command runs here (typically DeepSpeed's
own launcher, which starts the ranks on the hosts itself); then each host's
run is gathered into one FleetRun (model.fleet).

Transport (remote.ssh.Transport): one local process per agent, `ssh
HOST`, or inside a Slurm allocation `srun --overlap --nodelist NODE`
(remote.slurm), not pdsh nor one srun step over every node. Each agent
needs its own stdin (closing it is the stop signal), its own binary stdout
(the run comes back as a tar stream) and its own exit status (to tell which
node failed); pdsh merges every host's output line by line with a "host: "
prefix, has no per-host stdin and reports one exit status for all. The ssh
options of pdsh and DeepSpeed's launcher apply: PDSH_SSH_ARGS_APPEND. Under
srun the agent also reports its SLURMD_NODENAME, which must be the node it
was started for.

Attribution on remote ranks: the startup hook reaches them through
DeepSpeed's own environment forwarding (srun forwards the whole
environment: --export=ALL is its default). PYTHONPATH (the hook directory) is
exported by its runner (variables starting with PYTHON are); the events
directory is not, so it goes in a DeepSpeed environment file (DS_ENV_FILE,
with the user's own .deepspeed_env lines copied in). Each agent claims the
event files its node's ranks wrote (trace.agent.claim_events).

The hosts must have iotune at the same path as here, as DeepSpeed assumes
for its Python (or give --remote-iotune).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..remote.ssh import SshTransport, Transport
from ..errors import IotuneError
from ..model.fleet import FleetRun, NodeRun, node_status
from ..model.hook_events import EVENTS_ENV
from ..model.runfile import load_run
from . import child as childproc
from .attribution import inject_env
from .fleet_agents import Agent, AgentCost, agent_cost, start_error, stop_agents

Say = Callable[[str], None]
DS_ENV_NAME = ".deepspeed_env"


@dataclass(frozen=True)
class FleetOptions:
    hosts: tuple[str, ...]
    agent_args: tuple[str, ...]          # what each agent traces: --path/--device/--interval
    remote_iotune: str                   # the iotune program on the hosts
    inject: bool = True                  # attribution hooks in the job's Python processes
    transport: Transport = SshTransport()
    run_as: childproc.RunAs | None = None
    stdout_to_stderr: bool = False
    start_timeout_s: float = 180.0       # the agents compile their probe first
    stop_timeout_s: float = 60.0


@dataclass(frozen=True)
class FleetOutcome:
    fleet: FleetRun
    exit_status: int | None             # the command's, shell-style
    costs: tuple[AgentCost, ...]        # per host, in host order


def trace_fleet(argv: list[str], opts: FleetOptions, say: Say) -> FleetOutcome:
    """Start an agent on every host, run `argv` here, stop the agents and
    gather their runs (with the command's exit status and what each agent
    cost). Raises IotuneError, naming each host and the fix,
    when an agent cannot start (the command is then not run); an agent lost
    later makes its node lost, the others are kept."""
    if not argv:
        raise IotuneError("a multi-node trace needs a command: iotune trace --hosts H1,H2 -- CMD ARGS...")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    events = Path(tempfile.gettempdir()) / f"iotune-events-{uuid.uuid4().hex[:12]}" if opts.inject else None
    agent_args = [*opts.agent_args, *(["--events-dir", str(events)] if events else [])]
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(Agent.running(h, opts.remote_iotune, agent_args, opts.transport))
                  for h in opts.hosts]
        t0 = time.monotonic()
        _wait_ready(agents, opts.start_timeout_s, say)
        say(f"agents tracing on {len(agents)} hosts via {opts.transport.name} ({time.monotonic() - t0:.1f} s to start); "
            f"running the command")
        env = stack.enter_context(_job_env(events)) if events else None
        t0 = time.monotonic()
        status, interrupted = _run_command(argv, opts, env, agents, say)
        duration = time.monotonic() - t0
        stop_agents(agents, opts.stop_timeout_s)
        if events is not None:
            with contextlib.suppress(OSError):
                events.rmdir()
        nodes = tuple(_node(a, tuple(argv), status, interrupted, stack) for a in agents)
        costs = tuple(agent_cost(a) for a in agents)
    fleet = FleetRun(nodes=nodes, command=tuple(argv), started_at=started, transport=opts.transport.name,
                     duration_s=round(duration, 6))
    return FleetOutcome(fleet, status, costs)


def _wait_ready(agents: list[Agent], timeout_s: float, say: Say) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(a.ready or a.exited for a in agents) and time.monotonic() < deadline:
        time.sleep(0.05)
    failed = [a for a in agents if not a.ready]
    if failed:
        stop_agents(agents, 5.0)
        reasons = "\n".join(f"  {start_error(a, timeout_s)}" for a in failed)
        raise IotuneError(f"the trace agent could not start on {len(failed)} of {len(agents)} hosts "
                          f"(the command was not run):\n{reasons}")


def _run_command(argv: list[str], opts: FleetOptions, env: dict[str, str] | None, agents: list[Agent],
                 say: Say) -> tuple[int | None, bool]:
    """Run the command here to its end; (exit status, interrupted). An agent
    that dies meanwhile is said once; its node will be reported lost."""
    lost: set[str] = set()
    with childproc.Interrupts() as intr:
        proc = childproc.start(argv, opts.run_as, opts.stdout_to_stderr, None, env)
        intr.child = proc
        while proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
            intr.tick()
            for a in agents:
                if a.exited and a.host not in lost:
                    lost.add(a.host)
                    say(f"host {a.host}: {a.died_message()}; its node will be reported lost")
        return childproc.exit_status(proc.returncode), intr.interrupted


@contextlib.contextmanager
def _job_env(events: Path) -> Iterator[dict[str, str]]:
    """The command's environment: the hooks on PYTHONPATH (DeepSpeed's
    runner exports PYTHON* variables to the hosts) and the events directory
    in a DeepSpeed environment file, which also carries the user's own."""
    env = inject_env(dict(os.environ), events)
    name = os.environ.get("DS_ENV_FILE", DS_ENV_NAME)
    own = [Path(p, name) for p in (os.path.expanduser("~"), ".")]
    lines = [line for f in dict.fromkeys(own) if f.is_file() for line in f.read_text().splitlines() if "=" in line]
    fd, path = tempfile.mkstemp(prefix="iotune-deepspeed-env-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{line}\n" for line in [*lines, f"{EVENTS_ENV}={events}"]))
        yield env | {"DS_ENV_FILE": path}
    finally:
        os.unlink(path)


def _node(agent: Agent, command: tuple[str, ...], status: int | None, interrupted: bool,
          stack: contextlib.ExitStack) -> NodeRun:
    """The node's record from what its agent sent back."""
    where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="iotune-node-")))
    try:
        run_dir = agent.unpack_run(where)
    except IotuneError as e:
        return NodeRun(host=agent.host, status="lost", error=str(e))
    run = load_run(run_dir)
    if run.outcome == "completed":
        outcome = "interrupted" if interrupted else ("completed" if status == 0 else "failed")
        run = replace(run, command=command, exit_status=status, outcome=outcome)
    state, error = node_status(run, agent.late_error())
    wrong_node = agent.node_error()
    if wrong_node:
        state, error = "failed", wrong_node
    ranks = run.attribution.ranks if run.attribution is not None else ()
    return NodeRun(host=agent.host, status=state, run=run, error=error, ranks=tuple(ranks))
