"""A real Slurm cluster on one machine, over the multi-node bed
(volumes.nodes): munged, slurmctld, and one slurmd per bed node, from
Debian's slurm-wlm, configured in a fresh directory.

Debian's slurmd is built with multiple-slurmd support (`slurmd -N NAME`),
so each bed node gets its own slurmd: node `n<K>` is the bed node at
127.0.0.K (NodeAddr), with its own port. Each slurmd is started inside that
node's mount namespace and blkio cgroup (nsenter into its sshd's), so every
job step on node n<K> (the batch script, `srun` tasks, a trace agent) sees
that node's own capped drive at the bed's shared path, as an ssh session to
127.0.0.K does.

Everything lives in the bed's directory: the munge key and socket (munged's
own, not the machine's), slurm.conf, the controller's state, the nodes'
spool directories and the logs. Clients reach this cluster through
SLURM_CONF (`SlurmBed.env`). The plugins are the ones that work without
systemd or cgroup setup: proctrack/linuxproc, task/none, no accounting.
On exit (error and Ctrl-C included) the slurmds, slurmctld and munged are
stopped (SIGTERM, then SIGKILL), and the directory is removed; job steps
still running on a node go with the bed node's namespace (volumes.nodes).

What it cannot show, beyond the node bed's limits (one kernel, page cache,
clock and network): one controller on the same machine as the nodes (no
controller failover, no slow RPCs), no cgroup confinement of jobs (their
CPUs and memory are not fenced: ProctrackType=proctrack/linuxproc), every
job runs as root, and the nodes share the host name, so only SLURMD_NODENAME
and the mount namespace tell them apart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from iotune.host.cgroup import join_cgroup_preexec
from iotune.host.ledger import note_process, temp_dir
from iotune.host.proc import not_installed, terminate
from iotune.errors import IotuneError
from tests.beds.nodes import BedNode, NodeBed
from iotune.volumes.parts import require_root

TOOLS = {"munged": "munge", "mungekey": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
         "srun": "slurm-client", "sbatch": "slurm-client", "salloc": "slurm-client", "scontrol": "slurm-client",
         "sinfo": "slurm-client", "nsenter": "util-linux"}
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CLUSTER = "iotunebed"
PARTITION = "bed"
SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/logs/slurmctld.log
SlurmdLogFile={dir}/logs/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=10
KillWait=2
{nodes}
PartitionName={partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
NODE_LINE = "NodeName={name} NodeAddr={address} NodeHostname=localhost Port={port} CPUs={cpus} State=UNKNOWN"


@dataclass(frozen=True)
class SlurmNode:
    name: str                  # the Slurm node name (SLURMD_NODENAME in its jobs)
    bed_node: BedNode          # its drive, address and mount namespace
    port: int                  # its slurmd's
    slurmd_pid: int


@dataclass(frozen=True)
class SlurmBed:
    nodes: tuple[SlurmNode, ...]
    directory: Path            # munge, slurm.conf, state, spool, logs
    conf: Path
    shared_path: Path          # each node's drive, inside its jobs
    startup_s: float           # from munged's start until every node was idle

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def env(self) -> dict[str, str]:
        """What makes Slurm's commands (srun, sbatch, salloc, scontrol) use
        this cluster."""
        return {"SLURM_CONF": str(self.conf)}


@contextlib.contextmanager
def slurm_bed(bed: NodeBed) -> Iterator[SlurmBed]:
    """A Slurm cluster with one node per node of `bed`, every node idle
    when it is yielded; everything is stopped and removed on exit."""
    require_root("the Slurm bed")
    missing = [f"{tool} (apt package {pkg})" for tool, pkg in TOOLS.items() if _which(tool) is None]
    if missing:
        raise IotuneError(not_installed(", ".join(missing)) + " (the Slurm bed needs Debian's slurm-wlm)")
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        where = temp_dir(stack, "iotune-slurmbed-")
        where.chmod(0o755)   # munged wants every directory above its socket searchable by all
        for sub in ("munge", "state", "spool", "logs"):
            (where / sub).mkdir(mode=0o755)
        _start_munge(stack, where)
        ports = _free_ports(1 + len(bed.nodes))
        names = [f"n{n.address.rsplit('.', 1)[1]}" for n in bed.nodes]
        conf = where / "slurm.conf"
        conf.write_text(_slurm_conf(where, ports[0], names, bed, ports[1:]))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        _start(stack, ["slurmctld", "-D", "-i", "-f", str(conf)], where / "logs" / "slurmctld.out", env, None)
        nodes = []
        for name, node, port in zip(names, bed.nodes, ports[1:]):
            argv = ["nsenter", f"--mount=/proc/{node.sshd_pid}/ns/mnt", "--", _which("slurmd") or "slurmd",
                    "-D", "-N", name, "-f", str(conf)]
            proc = _start(stack, argv, where / "logs" / f"slurmd-{name}.out", env, node.drive.cgroup)
            nodes.append(SlurmNode(name, node, port, proc.pid))
        _wait_idle(names, env, where)
        yield SlurmBed(tuple(nodes), where, conf, bed.shared_path, round(time.monotonic() - t0, 3))


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def _start_munge(stack: contextlib.ExitStack, where: Path) -> None:
    """munged with a fresh key, on a socket in the bed's directory."""
    key = where / "munge" / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    socket_path = where / "munge" / "socket"
    argv = ["munged", "--foreground", f"--key-file={key}", f"--socket={socket_path}",
            f"--pid-file={where}/munge/munged.pid", f"--log-file={where}/logs/munged.log",
            f"--seed-file={where}/munge/seed"]
    proc = _start(stack, argv, where / "logs" / "munged.out", dict(os.environ), None)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise IotuneError(f"munged did not start ({_tail(where / 'logs' / 'munged.out')}); "
                              f"see {where}/logs/munged.log")
        time.sleep(0.02)


def _start(stack: contextlib.ExitStack, argv: list[str], log: Path, env: dict[str, str],
           cgroup: Path | None) -> subprocess.Popen[bytes]:
    """A daemon in the foreground, in its own session, stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                start_new_session=True, preexec_fn=join_cgroup_preexec(cgroup))
    note_process(stack, proc.pid, Path(argv[0]).name if argv[0] != "nsenter" else "slurmd")
    stack.callback(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (slurmd and slurmctld save and exit), SIGKILL if it lingers."""
    terminate(proc, STOP_TIMEOUT_S)


def _free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on every address (taken from the kernel)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("0.0.0.0", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def _slurm_conf(where: Path, ctld_port: int, names: list[str], bed: NodeBed, ports: list[int]) -> str:
    cpus = os.cpu_count() or 1
    lines = [NODE_LINE.format(name=name, address=node.address, port=port, cpus=cpus)
             for name, node, port in zip(names, bed.nodes, ports)]
    return SLURM_CONF.format(cluster=CLUSTER, ctld_port=ctld_port, dir=where, nodes="\n".join(lines),
                             partition=PARTITION, names=",".join(names))


def _wait_idle(names: list[str], env: dict[str, str], where: Path) -> None:
    """Until every node has registered and is idle."""
    deadline = time.monotonic() + START_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], capture_output=True, text=True,
                             env=env, check=False)
        states = dict(line.split(None, 1) for line in out.stdout.splitlines() if len(line.split()) == 2)
        if all(states.get(n) == "idle" for n in names):
            return
        time.sleep(0.1)
    raise IotuneError(f"the Slurm bed's nodes did not all become idle within {START_TIMEOUT_S:g} s "
                      f"({states or 'no answer from slurmctld'}): see the logs in {where}/logs "
                      f"(slurmctld.log, slurmd-<node>.log)")


def _tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no message"
