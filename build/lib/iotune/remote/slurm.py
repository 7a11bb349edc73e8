"""Slurm as the transport of a multi-node trace (`iotune trace --slurm`):
the nodes of the allocation this process runs in, and `srun` to run a
command on one of them.

The allocation is read from Slurm's environment: SLURM_JOB_ID, and
SLURM_JOB_NODELIST (a hostlist such as `gpu[01-04]`) expanded by `scontrol
show hostnames`, in Slurm's node order (the order of SLURM_NODEID).

One `srun` per node, each its own local process: `srun --overlap --nodes=1
--ntasks=1 --nodelist=NODE CMD`. One step over every node would merge the
nodes' stdout and share one stdin; the agent's protocol needs its own stdin
per node (closing it is the stop signal, and srun forwards the EOF), its own
binary stdout (srun passes bytes through unchanged when it is not given
--unbuffered, which would put a terminal in between) and its own exit
status. `--overlap` lets the agents' steps share the nodes' CPUs and memory
with the job's own steps (a later `srun` of the job that does not ask for
--overlap still gets every CPU). SIGTERM to srun cancels its step; SIGKILL
would leave the step running, so agents are stopped with SIGTERM first.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import IotuneError, UsageError
from ..host.proc import last_line

SRUN_FLAGS = ("--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=0")
NOT_FOUND = 2             # srun's status when slurmstepd cannot execve the program
OUTSIDE = ("--slurm traces every node of the Slurm allocation it runs in, and SLURM_JOB_ID is not set: run it "
           "inside one (in an sbatch script, or `salloc -N NODES iotune trace --slurm ...`), or name the nodes "
           "with --hosts/--hostfile (ssh)")


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    nodes: tuple[str, ...]          # Slurm node names, in SLURM_NODEID order


def slurm_allocation(env: Mapping[str, str]) -> SlurmAllocation:
    """The allocation this process runs in; UsageError outside one, and an
    IotuneError naming the fix when srun or scontrol is missing."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise UsageError(OUTSIDE)
    for tool in ("srun", "scontrol"):
        if shutil.which(tool, path=env.get("PATH")) is None:
            raise IotuneError(f"{tool} not found on PATH inside Slurm job {job_id}: --slurm runs the agents with "
                              f"srun; install Slurm's client commands (Debian: slurm-client) on the nodes or put "
                              f"them on PATH, or use --hosts/--hostfile (ssh)")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise IotuneError(f"Slurm job {job_id} has no SLURM_JOB_NODELIST: run iotune in the job's batch script or "
                          f"under salloc, where Slurm sets it")
    return SlurmAllocation(job_id, expand_hostlist(nodelist))


def expand_hostlist(nodelist: str) -> tuple[str, ...]:
    """A Slurm hostlist (`n[1-3],gpu07`) as node names, by `scontrol show
    hostnames` (Slurm's own parser: the syntax has ranges, padding, lists)."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IotuneError(f"`scontrol show hostnames {nodelist}` failed ({e}): check Slurm's client setup") from None
    nodes = tuple(line.strip() for line in out.stdout.splitlines() if line.strip())
    if out.returncode != 0 or not nodes:
        raise IotuneError(f"`scontrol show hostnames {nodelist}` failed (status {out.returncode}): "
                          f"{last_line(out.stderr)}; check SLURM_JOB_NODELIST and Slurm's client setup")
    return nodes


def is_task_summary(line: str) -> bool:
    """srun's own closing line for a task ("srun: error: n3: task 0: Exited
    with exit code 2"), which says less than the line before it."""
    return line.startswith("srun: error: ") and ": task " in line and ("Exited with exit code" in line
                                                                        or "Killed" in line
                                                                        or "Terminated" in line)


@dataclass(frozen=True)
class SrunTransport:
    """One `srun --overlap` step per node of job `job_id`."""

    job_id: str

    @property
    def name(self) -> str:
        return "srun"

    def argv(self, host: str, remote_argv: Sequence[str]) -> list[str]:
        return ["srun", f"--jobid={self.job_id}", *SRUN_FLAGS, f"--nodelist={host}", "--job-name=iotune-agent",
                "--", *remote_argv]

    def last_message(self, stderr: str) -> str:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        useful = [line for line in lines if not is_task_summary(line)]
        return (useful or lines or ["no message"])[-1]

    def error(self, host: str, code: int | None, tail: str, remote_iotune: str) -> str | None:
        if code == NOT_FOUND and "execve()" in tail:
            return (f"node {host}: iotune not found at {remote_iotune} ({tail}): install iotune at the same path "
                    f"on every node of the allocation, or pass --remote-iotune PATH")
        if tail.startswith("srun: error:"):
            return (f"node {host}: srun could not start the agent in job {self.job_id} ({tail}): check that the "
                    f"job is still running and that the node is in it (`scontrol show job {self.job_id}`)")
        return None

    def node_check(self, host: str, reported: str | None) -> str:
        if reported == host:
            return ""
        return (f"node {host}: srun ran the agent on {reported or 'a node without SLURMD_NODENAME'}, not on {host}; "
                f"its run is not this node's")
