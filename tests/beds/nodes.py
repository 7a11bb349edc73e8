"""A multi-node test bed on one machine: N "nodes", each an sshd listening on
its own loopback address (127.0.0.2, 127.0.0.3, ...) inside its own mount
namespace, where one shared path (a job's nvme_path, /mnt/iotune-nvme by
default) is that node's own capped scratch drive (volumes.scratch). Every
session on a node (ssh, pdsh, DeepSpeed's launcher) inherits the node's
namespace and blkio cgroup, so `ssh 127.0.0.3 df /mnt/iotune-nvme` shows
node 3's drive, and I/O there runs at node 3's cap.

Logins are as root with a key generated into the bed's directory; clients
use the generated ssh_config (`ssh -F`, or PDSH_SSH_ARGS_APPEND for pdsh and
DeepSpeed's launcher): no host key checking, no known_hosts written, no
change to the machine's own ssh setup. On exit (error and Ctrl-C included)
every process in a node's namespace is killed (the namespace goes with the
last of them), then the drives are unmounted, detached and their cgroups
removed, and the directory with the keys is deleted. The shared path, if
the bed made it, is removed too, unless another bed (another test run) still
has a node's drive mounted on it: then it stays, empty.

What the bed cannot show: it is one kernel. There is no real network (ranks
talk gloo over loopback: no contention, latency or bandwidth limit between
nodes), one page cache and one scheduler (all nodes share the CPUs and
memory, so a busy node slows the others), one clock (no clock skew between
nodes), one hostname, and the rest of the filesystem (/tmp, the venv) is
shared; only the shared path differs per node. Storage is the one thing
that differs, which is what the bed is for. Since the filesystem is shared,
so is the cache of built DeepSpeed ops: a session on a node gets the
caller's TORCH_EXTENSIONS_DIR (when set), as a real cluster's shared home
would give every node the same cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from iotune.fs import mountinfo
from iotune.host.cgroup import join_cgroup_preexec
from iotune.host.undo import empty_namespace
from iotune.host.ledger import note, note_process
from iotune.host.proc import not_installed, run
from iotune.errors import IotuneError
from iotune.volumes.parts import require_root, workdir
from iotune.volumes.scratch import ScratchDrive, scratch_drive

SHARED_PATH = Path("/mnt/iotune-nvme")
START_TIMEOUT_S = 10.0
SSHD_CONFIG = """\
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/authorized_keys
PidFile none
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100
MaxSessions 100
LogLevel ERROR
"""
SSH_CONFIG = """\
Host *
  User root
  Port {port}
  IdentityFile {dir}/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  ConnectTimeout 5
  KexAlgorithms curve25519-sha256
  LogLevel ERROR
"""
# In the node's fresh namespace: the node's drive on the shared path, then sshd.
NODE_SCRIPT = 'mount --bind "$1" "$2" && exec "$3" -D -e -f "$4" -o "ListenAddress=$5"'


@dataclass(frozen=True)
class BedNode:
    address: str               # the node's "host name": 127.0.0.N
    drive: ScratchDrive        # its drive, mounted on the bed's shared path inside the node
    cap_bytes_per_s: int       # read and write cap of the drive (0: none)
    sshd_pid: int
    mount_ns: str              # its mount namespace, as /proc/PID/ns/mnt reads ("mnt:[...]")


@dataclass(frozen=True)
class NodeBed:
    nodes: tuple[BedNode, ...]
    shared_path: Path
    port: int
    directory: Path            # keys, configs and sshd logs
    ssh_config: Path

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(n.address for n in self.nodes)

    def env(self) -> dict[str, str]:
        """Variables that make pdsh, DeepSpeed's launcher and iotune log in
        to the nodes with the bed's key and config."""
        return {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": f"-F {self.ssh_config}"}

    def ssh(self, node: BedNode | str, argv: Sequence[str]) -> list[str]:
        """The ssh command line running `argv` on `node`."""
        host = node.address if isinstance(node, BedNode) else node
        return ["ssh", "-F", str(self.ssh_config), host, "--", *argv]

    def hostfile(self, slots: int = 1) -> str:
        """DeepSpeed's hostfile for the bed: `host slots=N` per node."""
        return "".join(f"{h} slots={slots}\n" for h in self.hosts)


@contextlib.contextmanager
def node_bed(caps_bytes_per_s: Sequence[int], shared_path: Path = SHARED_PATH, size_bytes: int = 512 << 20,
             first_address: int = 2, directory: Path | None = None) -> Iterator[NodeBed]:
    """One node per cap (bytes/s, 0: uncapped), at 127.0.0.<first_address>
    onwards, each with an ext4 scratch drive of `size_bytes` on
    `shared_path`; everything is torn down on exit."""
    require_root("the multi-node bed")
    for tool in ("sshd", "ssh", "ssh-keygen", "unshare"):
        if _which(tool) is None:
            raise IotuneError(not_installed(tool) + " (the bed needs openssh-server, openssh-client, util-linux)")
    if not 1 <= len(caps_bytes_per_s) <= 250 - first_address:
        raise IotuneError(f"a bed has 1 to {250 - first_address} nodes, not {len(caps_bytes_per_s)}")
    with contextlib.ExitStack() as stack:
        where = workdir(stack, directory, "iotune-nodebed-")
        _make_keys(where)
        addresses = [f"127.0.0.{first_address + i}" for i in range(len(caps_bytes_per_s))]
        port = _free_port(addresses)
        sshd_config = where / "sshd_config"
        sshd_config.write_text(SSHD_CONFIG.format(dir=where) + _session_env(os.environ))
        ssh_config = where / "ssh_config"
        ssh_config.write_text(SSH_CONFIG.format(dir=where, port=port))
        _make_shared_path(stack, shared_path)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # sshd's privilege separation directory
        nodes = []
        for address, cap in zip(addresses, caps_bytes_per_s):
            drive = stack.enter_context(scratch_drive(where, size_bytes, cap, "ext4"))
            nodes.append(_start_node(stack, where, address, port, drive, cap, shared_path, sshd_config))
        yield NodeBed(tuple(nodes), shared_path, port, where, ssh_config)


# What a node's sessions inherit from whoever built the bed (sshd gives a session a clean environment).
INHERITED = ("TORCH_EXTENSIONS_DIR",)


# A node's sessions do not read the host's shell rc files. bash reads
# ~/.bashrc in an ssh session only as a top-level shell (SHLVL below 2 once
# it has counted itself), and here ~ is the host's own home: its rc is
# whatever the machine's user put there, run once per session, shared with
# the host, and killed with the node at teardown. pyenv's `pyenv init -` is
# one such rc: a rehash killed mid-way leaves its lock file, and every shell
# that reads the rc afterwards (the host's own included) waits 60 s for it.
SESSION_ENV = {"SHLVL": "1"}


def _session_env(environ: Mapping[str, str]) -> str:
    """The sshd_config line setting a session's variables: the bed's own,
    then the inherited ones that are set here (sshd reads only the first
    SetEnv line, so all go on one)."""
    pairs = [f'"{name}={value}"' for name, value in SESSION_ENV.items()]
    pairs += [f'"{name}={environ[name]}"' for name in INHERITED if environ.get(name)]
    return f"SetEnv {' '.join(pairs)}\n"


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def _make_keys(where: Path) -> None:
    for name in ("host_key", "client_key"):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"iotune-nodebed-{name}", "-f", str(where / name)])
    (where / "authorized_keys").write_text((where / "client_key.pub").read_text())


def _free_port(addresses: list[str]) -> int:
    """A TCP port free on every address (taken from the kernel for the first)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = int(s.getsockname()[1])
        if all(_port_free(a, port) for a in addresses[1:]):
            return port
    raise IotuneError(f"no TCP port free on all of {', '.join(addresses)}: stop what listens there")


def _port_free(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


def _make_shared_path(stack: contextlib.ExitStack, path: Path) -> None:
    """The shared path must exist as a directory to be mounted on; one made
    here is removed on exit (it stays empty outside the nodes)."""
    if path.is_dir():
        return
    if path.exists():
        raise IotuneError(f"{path} exists and is not a directory: choose another shared path for the bed")
    path.mkdir(parents=True)
    note(stack, "dir", path=path)
    stack.callback(_rmdir_unless_mounted, path)


def _rmdir_unless_mounted(path: Path) -> None:
    """Remove the shared path, unless another bed's node (another mount
    namespace) still has a drive mounted on it: removing a mount point
    detaches it in every namespace."""
    if not mounted_in_any_namespace(path):
        with contextlib.suppress(OSError):
            path.rmdir()


def mounted_in_any_namespace(path: Path) -> bool:
    """Whether `path` is a mount point in any process's mount namespace."""
    seen: set[str] = set()
    for entry in Path("/proc").glob("[0-9]*/ns/mnt"):
        try:
            ns = os.readlink(entry)
            if ns in seen:
                continue
            seen.add(ns)
            mounts = mountinfo.read(entry.parent.parent / "mountinfo")
        except OSError:
            continue
        if any(m.mount_point == str(path) for m in mounts):
            return True
    return False


def _start_node(stack: contextlib.ExitStack, where: Path, address: str, port: int, drive: ScratchDrive,
                cap: int, shared_path: Path, sshd_config: Path) -> BedNode:
    if drive.mount_point is None:
        raise IotuneError("a bed node's drive has no filesystem")   # scratch_drive was given fstype
    log = (where / f"sshd-{address}.log").open("wb")
    stack.callback(log.close)
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", NODE_SCRIPT, "sh",
            str(drive.mount_point), str(shared_path), str(_which("sshd")), str(sshd_config), f"{address}:{port}"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            preexec_fn=join_cgroup_preexec(drive.cgroup), start_new_session=True)
    own_ns = os.readlink("/proc/self/ns/mnt")
    note_process(stack, proc.pid, f"bed node {address}")
    stack.callback(_stop_node, proc)
    _wait_listening(proc, address, port, where / f"sshd-{address}.log")
    ns = os.readlink(f"/proc/{proc.pid}/ns/mnt")
    if ns == own_ns:
        raise IotuneError(f"node {address}: sshd is not in a mount namespace of its own (unshare failed?)")
    note(stack, "namespace", ns=ns, what=f"bed node {address}")
    stack.callback(_kill_namespace, ns, proc)
    return BedNode(address, drive, cap, proc.pid, ns)


def _wait_listening(proc: subprocess.Popen[bytes], address: str, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise IotuneError(f"node {address}: sshd exited ({proc.returncode}) at start: "
                              f"{_last(log)}; see {log}")
        with socket.socket() as s:
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.05)
    raise IotuneError(f"node {address}: sshd did not listen on port {port} within {START_TIMEOUT_S:g} s; see {log}")


def _last(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _kill_namespace(ns: str, proc: subprocess.Popen[bytes], term_s: float = 2.0, timeout_s: float = 10.0) -> None:
    """SIGTERM, then after `term_s` SIGKILL, every process in the node's
    namespace (its sshd and every session it started) until none is left:
    the namespace, and its hold on the drive, goes with the last one."""
    left = empty_namespace(ns, term_s, timeout_s, between=proc.poll)   # poll reaps the sshd itself
    if left:
        raise IotuneError(f"processes {left} of a bed node would not exit; kill them by hand")


def _stop_node(proc: subprocess.Popen[bytes]) -> None:
    """The node's sshd (also when it failed before its namespace was known)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
