"""Which nodes a multi-node trace or sweep runs on and how to reach them:
every node of the Slurm allocation through srun (--slurm, or a `deepspeed
--launcher slurm` command), or the hosts of --hosts, --hostfile or a
DeepSpeed launcher command's --hostfile through ssh."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import UsageError
from .slurm import SrunTransport, slurm_allocation
from .ssh import SshTransport, Transport, ssh_options_from_env

Say = Callable[[str], None]
DEEPSPEED_LAUNCHERS = ("deepspeed", "ds")
VERBS = {"trace": "tracing", "sweep": "sweeping"}


def read_hostfile(path: Path) -> tuple[str, ...]:
    """The hosts of a DeepSpeed hostfile (`host slots=N` lines, # comments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read the hostfile {path}: {e.strerror}") from None
    hosts: list[str] = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, *rest = line.split()
        if any(not r.startswith("slots=") or not r[6:].isdigit() for r in rest):
            raise UsageError(f"{path} line {n}: expected `HOST slots=N` (DeepSpeed's hostfile format), "
                              f"got `{raw.strip()}`")
        if host in hosts:
            raise UsageError(f"{path} line {n}: host {host} is listed twice: list each host once")
        hosts.append(host)
    if not hosts:
        raise UsageError(f"the hostfile {path} names no hosts: one `HOST slots=N` line per node")
    return tuple(hosts)


def deepspeed_option(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of a `deepspeed` launcher command line's option (`--name
    V` or `--name=V`) before the user script, if any."""
    if not argv or os.path.basename(argv[0]) not in DEEPSPEED_LAUNCHERS:
        return None
    for i, arg in enumerate(argv[1:], 1):
        name, eq, value = arg.partition("=")
        if eq and name in names:
            return value
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        if not arg.startswith("-"):
            return None       # the user script: the rest are its arguments
    return None


def deepspeed_hostfile(argv: list[str]) -> Path | None:
    """The --hostfile/-H of a `deepspeed` launcher command line, if any."""
    value = deepspeed_option(argv, ("--hostfile", "-H"))
    return Path(value) if value is not None else None


def listed_hosts(hosts: str | None, hostfile: Path | None, argv: list[str], say: Say) -> tuple[str, ...]:
    """The hosts of --hosts (comma-separated), --hostfile, or the --hostfile
    of a DeepSpeed launcher command naming more than one host; () for one
    node."""
    if hosts and hostfile:
        raise UsageError("give --hosts or --hostfile, not both")
    if hosts:
        names = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if len(set(names)) != len(names):
            raise UsageError(f"--hosts names a host twice ({hosts}): list each host once")
        return names
    if hostfile:
        return read_hostfile(hostfile)
    launcher_file = deepspeed_hostfile(argv)
    if launcher_file is not None and launcher_file.is_file():
        names = read_hostfile(launcher_file)
        if len(names) > 1:
            say(f"tracing every host of {launcher_file} (DeepSpeed's --hostfile): {', '.join(names)}")
            return names
    return ()


def find_nodes(hosts: str | None, hostfile: Path | None, slurm: bool, argv: list[str], env: Mapping[str, str],
               say: Say, command: str = "trace") -> tuple[tuple[str, ...], Transport] | None:
    """The nodes of a multi-node `command` (trace or sweep) and how to reach
    them; None for a single-node one. `env` is this process's environment
    (the Slurm allocation, ssh options)."""
    verb = VERBS[command]
    if not slurm and not hosts and not hostfile and deepspeed_option(argv, ("--launcher",)) == "slurm":
        say("tracing every node of the Slurm allocation (DeepSpeed's --launcher slurm): as with --slurm")
        slurm = True
    if slurm:
        if hosts or hostfile:
            raise UsageError("give --slurm or --hosts/--hostfile, not both: --slurm traces every node of the "
                             "Slurm allocation")
        alloc = slurm_allocation(env)
        say(f"{verb} the {len(alloc.nodes)} node(s) of Slurm job {alloc.job_id} via srun: {', '.join(alloc.nodes)}")
        return alloc.nodes, SrunTransport(alloc.job_id)
    names = listed_hosts(hosts, hostfile, argv, say)
    if names:
        return names, SshTransport(ssh_options_from_env(dict(env)))
    nnodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    # (not inside a job step: that is a node's own part of a multi-node run, started by srun)
    if env.get("SLURM_JOB_ID") and nnodes.isdigit() and int(nnodes) > 1 and not env.get("SLURM_STEP_ID"):
        say(f"inside Slurm job {env['SLURM_JOB_ID']} of {nnodes} nodes, {verb} this node only: add --slurm "
            f"(and --path) to {command} every node")
    return None


def default_remote_iotune() -> str:
    """iotune at the same path as here (the venv's entry point), as
    DeepSpeed's launcher assumes the same Python path on every node."""
    return str(Path(sys.executable).with_name("iotune"))
